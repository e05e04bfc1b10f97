"""Lint of runtime_images/: every Containerfile parsed (dockerfile-parse) and held to what the
images promise (pinned bases, non-root, OCI labels, exec-form entry points, no RUN in the
images built here), and the wheel lock held to pyproject's pins. The images themselves are
built by tools/images/build.sh and run in the e2e tier; the engine wrappers' bases are not
reachable here, so this lint is all they get."""

from __future__ import annotations

import io
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from inferfleet import __version__
from inferfleet.engines import tensorrt_llm, vllm
from inferfleet.engines.common import NON_ROOT_UID

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "runtime_images"
LOCK = IMAGES / "requirements.lock"

BUILT_HERE = {"operator": "run", "router": "router", "sim-engine": "sim-engine"}
ENGINE_WRAPPERS = {"vllm": vllm, "tensorrt-llm": tensorrt_llm}
# Images that must run as root, and the reason their Containerfile gives for it.
ROOT_REQUIRED = {"tensorrt-llm": "MPI launcher is set up"}
IMAGE_USER = "65532:65532"
ENTRY_POINT = "/opt/inferfleet/bin/inferfleet"
REQUIRED_LABELS = ("title", "version", "revision", "created", "source", "licenses")
BUILD_ARGS = {"VERSION": __version__, "REVISION": "0" * 40, "CREATED": "now", "SOURCE": "src"}
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def containerfiles() -> list[Path]:
    return sorted(IMAGES.glob("*/Containerfile"))


def parse(path: Path) -> DockerfileParser:
    return DockerfileParser(fileobj=io.BytesIO(path.read_bytes()), build_args=BUILD_ARGS)


def instructions(parser: DockerfileParser, name: str) -> list[str]:
    return [str(i["value"]) for i in parser.structure if i["instruction"] == name]


def comments(path: Path) -> str:
    return " ".join(
        line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#")
    )


def exec_form(value: str) -> list[str]:
    parsed: Any = json.loads(value)
    assert isinstance(parsed, list), value
    assert all(isinstance(item, str) for item in parsed), value
    return [str(item) for item in parsed]


def test_every_image_has_a_containerfile() -> None:
    names = {path.parent.name for path in containerfiles()}
    assert names == set(BUILT_HERE) | set(ENGINE_WRAPPERS)


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_base_is_scratch_or_pinned(path: Path) -> None:
    parser = parse(path)
    bases = parser.parent_images
    assert len(bases) == 1, f"one stage expected: {bases}"
    base = bases[0]
    if base == "scratch":
        return
    reference = base.split("@", 1)[0]
    repository, _, tag = reference.rpartition(":")
    assert "/" in repository, base
    assert tag, f"{base}: no tag"
    assert tag != "latest"
    if not _DIGEST.search(base):
        # A tag alone moves if upstream re-pushes it: only where no digest could be checked,
        # and the file must say so.
        assert "Pinned by tag" in comments(path), f"{base}: no digest and no reason"
    assert not re.search(r":latest\b", path.read_text())


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_oci_labels(path: Path) -> None:
    labels = parse(path).labels
    prefix = "org.opencontainers.image."
    for key in REQUIRED_LABELS:
        assert prefix + key in labels, f"{prefix}{key} missing"
    assert labels[prefix + "licenses"] == "Apache-2.0"
    assert labels[prefix + "title"] == f"inferfleet-{path.parent.name}"
    # The version is the package's, passed in by the build.
    assert labels[prefix + "version"] == __version__
    assert labels[prefix + "revision"] == BUILD_ARGS["REVISION"]


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_user_is_not_root_where_the_image_allows(path: Path) -> None:
    users = instructions(parse(path), "USER")
    name = path.parent.name
    if name in ROOT_REQUIRED:
        assert users == [], "this image is only set up for root"
        assert ROOT_REQUIRED[name] in comments(path), "running as root needs its reason"
        return
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit(), f"numeric uid expected (runAsNonRoot cannot check a name): {uid}"
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0


@pytest.mark.parametrize("path", containerfiles(), ids=lambda p: p.parent.name)
def test_entry_points_are_exec_form(path: Path) -> None:
    # No shell at run time: a shell-form ENTRYPOINT or CMD would need /bin/sh.
    parser = parse(path)
    for name in ("ENTRYPOINT", "CMD"):
        for value in instructions(parser, name):
            assert exec_form(value)
    for value in instructions(parser, "ADD") + instructions(parser, "COPY"):
        assert "://" not in value, "nothing fetched over the network at build time"


@pytest.mark.parametrize("name", sorted(BUILT_HERE))
def test_images_built_here(name: str) -> None:
    path = IMAGES / name / "Containerfile"
    parser = parse(path)
    assert parser.baseimage == "scratch"
    assert instructions(parser, "RUN") == [], "built with nothing executed inside"
    assert instructions(parser, "ADD") == ["inferfleet-rootfs.tar /"]
    assert instructions(parser, "USER") == [IMAGE_USER]
    entrypoint = exec_form(instructions(parser, "ENTRYPOINT")[-1])
    assert entrypoint == [ENTRY_POINT, BUILT_HERE[name]]
    env = parser.envs
    assert env["PATH"].split(":")[0] == str(Path(ENTRY_POINT).parent)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp"


def test_images_built_here_share_their_layer() -> None:
    # One ADD of one tree, before anything that differs: registries and nodes store it once.
    def layer_part(name: str) -> list[tuple[str, str]]:
        parser = parse(IMAGES / name / "Containerfile")
        steps = [(str(i["instruction"]), str(i["value"])) for i in parser.structure]
        return [step for step in steps if step[0] in {"FROM", "ADD", "COPY", "ENV", "USER"}]

    parts = {name: layer_part(name) for name in BUILT_HERE}
    assert len({json.dumps(part) for part in parts.values()}) == 1, parts


def test_base_user_files_name_the_image_user() -> None:
    uid = IMAGE_USER.partition(":")[0]
    passwd = (IMAGES / "base" / "etc" / "passwd").read_text().splitlines()
    assert any(line.split(":")[2] == uid for line in passwd)


@pytest.mark.parametrize("name", sorted(ENGINE_WRAPPERS))
def test_engine_wrappers_wrap_the_image_the_renderer_names(name: str) -> None:
    module = ENGINE_WRAPPERS[name]
    parser = parse(IMAGES / name / "Containerfile")
    runs = instructions(parser, "RUN")
    if name == "tensorrt-llm":
        # The SSH server a multi-node group's workers run, and nothing else.
        (run,) = runs
        installed = run.split("apt-get install", 1)[1].split("&&", 1)[0].split()
        assert [word for word in installed if not word.startswith("-")] == ["openssh-server"]
    else:
        assert runs == [], "a wrapper adds no file"
    reference = parser.baseimage.split("@", 1)[0]
    repository, _, tag = reference.rpartition(":")
    assert repository.removeprefix("docker.io/") == module.IMAGE_REPOSITORY
    assert tag.removeprefix("v") == module.PINNED_VERSION


def test_vllm_wrapper_runs_as_the_renderers_user() -> None:
    users = instructions(parse(IMAGES / "vllm" / "Containerfile"), "USER")
    assert users == [f"{NON_ROOT_UID}:{NON_ROOT_UID}"]


def locked() -> dict[str, tuple[str, list[str]]]:
    """Package -> (version, hashes) of requirements.lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    text = LOCK.read_text().replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        assert version, f"unpinned: {spec}"
        hashes = [o.removeprefix("--hash=") for o in options if o.startswith("--hash=")]
        entries[re.sub(r"[-_.]+", "-", name).lower()] = (version, hashes)
    return entries


def test_lock_pins_pyprojects_dependencies_with_hashes() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entries = locked()
    assert entries
    for name, (version, hashes) in entries.items():
        assert hashes, f"{name}=={version} has no hash"
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert key in entries, f"{requirement.name} is not in {LOCK.name}"
        assert entries[key][0] in requirement.specifier, (
            f"{requirement.name}: pyproject {requirement.specifier}, lock {entries[key][0]}; "
            "run tools/images/lock.sh"
        )
