"""Pods run from their images, as a kubelet runs them through an OCI runtime (crun).

An image store is a directory of OCI image layouts, one per repository, each named for the
repository's last path component (`<store>/router` holds `inferfleet/router:<tag>`), as
tools/images/build.sh writes them. An image is unpacked once per manifest digest (umoci) into
a cache shared by every cluster; each container gets an overlay over it (its own writable
layer, or none writable with `readOnlyRootFilesystem`), so no pod changes what another sees.

What a kubelet decides, this module decides purely (`container_launch`, `runtime_config`):
the command line from the container's `command`/`args` and the image's entrypoint/cmd, the
environment (the image's, then the container's, then the API server's address), the user
(`runAsUser`/`runAsGroup`, else the image's user; `fsGroup` and `supplementalGroups` as
extra groups; `runAsNonRoot` refused for uid 0), the mounts (`emptyDir` as a bind directory or,
with `medium: Memory`, a tmpfs; `projected` volumes as files the agent writes: the
ServiceAccount token, `ca.crt`, `namespace`; `secret` volumes as a file per key, in the
volume's `defaultMode` and the pod's `fsGroup`), and the isolation: the host's network
namespace (the pod's IP is a loopback address the process binds to), its own pid, mount, ipc
and uts namespaces, no capabilities, `no_new_privs`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from inferfleet.devcluster.podspec import (
    SecretValue,
    container_env,
    expand_references,
    field_value,
)

CACHE_VARIABLE: Final = "INFERFLEET_CACHE_DIR"
# Where the ServiceAccount admission plugin mounts the `kube-api-access-*` projected volume.
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# Kubernetes' defaults: files of projected volumes 0644, emptyDir directories 0777.
PROJECTED_FILE_MODE: Final = 0o644
EMPTY_DIR_MODE: Final = 0o777
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# On a host with cgroup v1 controllers and a v2 hierarchy holding controllers too (hybrid
# mode), crun refuses to start anything, even without a cgroup manager; hidden from it.
UNIFIED_CGROUP: Final = Path("/sys/fs/cgroup/unified")

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class ImageError(ValueError):
    """A pod that cannot run from its image as it is (what a kubelet reports as
    CreateContainerConfigError)."""


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image configuration that decide how a container starts."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    user: str = ""
    working_dir: str = "/"

    @classmethod
    def from_oci(cls, document: Mapping[str, Any]) -> ImageConfig:
        """From an image configuration blob (application/vnd.oci.image.config.v1+json)."""
        config = document.get("config") or {}
        env = []
        for item in config.get("Env") or []:
            name, _, value = str(item).partition("=")
            env.append((name, value))
        return cls(
            entrypoint=tuple(str(a) for a in config.get("Entrypoint") or ()),
            cmd=tuple(str(a) for a in config.get("Cmd") or ()),
            env=tuple(env),
            user=str(config.get("User") or ""),
            working_dir=str(config.get("WorkingDir") or "/"),
        )


@dataclass(frozen=True)
class Image:
    reference: str
    layout: Path
    tag: str
    manifest_digest: str
    config: ImageConfig


def split_reference(reference: str) -> tuple[str, str | None, str | None]:
    """`[registry/]path/name[:tag][@digest]` -> (repository, tag, digest)."""
    name, _, digest = reference.partition("@")
    repository, tag = name, None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = name.rpartition(":")
    return repository, tag, digest or None


def layout_name(reference: str) -> str:
    """The layout a reference is looked up in: its repository's last path component (so a
    registry prefix set in a chart's values finds the same local image)."""
    return split_reference(reference)[0].rsplit("/", 1)[-1]


def manifest_for(index: Mapping[str, Any], reference: str) -> str | None:
    """The digest of the manifest in a layout's `index.json` that `reference` names: by
    digest, else by tag (`org.opencontainers.image.ref.name`; no tag means `latest`)."""
    _, tag, digest = split_reference(reference)
    for manifest in index.get("manifests") or []:
        annotations = manifest.get("annotations") or {}
        if digest is not None:
            if manifest.get("digest") == digest:
                return digest
        elif annotations.get("org.opencontainers.image.ref.name") == (tag or "latest"):
            return str(manifest["digest"])
    return None


def command_line(
    container: Mapping[str, Any], image: ImageConfig, env: Mapping[str, str]
) -> tuple[str, ...]:
    """The kubelet's rules: `command` replaces the entrypoint and drops the image's cmd;
    `args` replace the cmd; `$(VAR)` references are expanded from the container's env."""
    command = container.get("command")
    args = container.get("args")
    if command:
        argv = [*command, *(args or ())]
    else:
        argv = [*image.entrypoint, *(image.cmd if args is None else args)]
    if not argv:
        raise ImageError("neither the container nor the image says what to run")
    return tuple(expand_references(str(a), env) for a in argv)


def _security(pod: Mapping[str, Any], container: Mapping[str, Any], key: str) -> Any:
    """A container's securityContext field, else the pod's."""
    own = (container.get("securityContext") or {}).get(key)
    return (
        own if own is not None else ((pod.get("spec") or {}).get("securityContext") or {}).get(key)
    )


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()


def identity(pod: Mapping[str, Any], container: Mapping[str, Any], image: ImageConfig) -> Identity:
    """`runAsUser`/`runAsGroup` (container, else pod), else the image's numeric `uid[:gid]`;
    `fsGroup` and `supplementalGroups` become additional groups."""
    image_user, _, image_group = image.user.partition(":")
    run_as_user = _security(pod, container, "runAsUser")
    run_as_group = _security(pod, container, "runAsGroup")
    if run_as_user is None and image_user and not image_user.isdigit():
        raise ImageError(f"the image's user {image.user!r} is not numeric; set runAsUser")
    uid = int(run_as_user if run_as_user is not None else image_user or 0)
    if run_as_group is not None:
        gid = int(run_as_group)
    elif run_as_user is None and image_group.isdigit():
        gid = int(image_group)
    else:
        gid = 0
    if uid == 0 and _security(pod, container, "runAsNonRoot"):
        raise ImageError("runAsNonRoot, but the container would run as uid 0")
    pod_security = (pod.get("spec") or {}).get("securityContext") or {}
    extra = [int(g) for g in pod_security.get("supplementalGroups") or ()]
    if pod_security.get("fsGroup") is not None:
        extra.append(int(pod_security["fsGroup"]))
    return Identity(uid, gid, tuple(sorted(set(extra) - {gid})))


@dataclass(frozen=True)
class Token:
    """A projected ServiceAccount token: TokenRequest for the pod's account, bound to it."""

    path: str
    expiration_s: int
    audience: str | None = None


@dataclass(frozen=True)
class ConfigMapKey:
    path: str
    config_map: str
    key: str


@dataclass(frozen=True)
class FieldValue:
    path: str
    value: str


@dataclass(frozen=True)
class SecretKeys:
    """Every key of a Secret as a file named for it (a `secret` volume without `items`), in
    `mode`, of the pod's `fsGroup` where it has one, as a kubelet writes them."""

    secret: str
    mode: int = PROJECTED_FILE_MODE
    group: int | None = None


ProjectedFile = Token | ConfigMapKey | FieldValue | SecretKeys


@dataclass(frozen=True)
class Volume:
    """A pod volume as the agent provides it: a directory it prepares (emptyDir, projected)
    or a tmpfs."""

    name: str
    tmpfs: bool = False
    files: tuple[ProjectedFile, ...] = ()


def projected_files(
    pod: Mapping[str, Any], sources: Sequence[Mapping[str, Any]]
) -> list[ProjectedFile]:
    """The files of a projected volume: its token, ConfigMap keys and downward API fields."""
    files: list[ProjectedFile] = []
    for source in sources:
        if "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            files.append(
                Token(
                    str(token["path"]),
                    int(token.get("expirationSeconds") or 3600),
                    token.get("audience"),
                )
            )
        elif "configMap" in source:
            config_map = source["configMap"]
            items = config_map.get("items")
            if not items:
                raise ImageError(f"configMap {config_map.get('name')}: only items are supported")
            for item in items:
                files.append(
                    ConfigMapKey(str(item["path"]), str(config_map["name"]), str(item["key"]))
                )
        elif "downwardAPI" in source:
            for item in source["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    raise ImageError(f"downwardAPI {item.get('path')}: only fieldRef is supported")
                files.append(
                    FieldValue(str(item["path"]), field_value(pod, item["fieldRef"]["fieldPath"]))
                )
        else:
            raise ImageError(f"projected source {sorted(source)} is not supported")
    return files


def pod_volumes(pod: Mapping[str, Any]) -> dict[str, Volume]:
    """The pod's volumes the agent can provide; any other kind is refused."""
    volumes = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = str(volume["name"])
        if "emptyDir" in volume:
            medium = (volume["emptyDir"] or {}).get("medium")
            volumes[name] = Volume(name, tmpfs=medium == "Memory")
        elif "projected" in volume:
            sources = volume["projected"].get("sources") or []
            volumes[name] = Volume(name, files=tuple(projected_files(pod, sources)))
        elif "secret" in volume:
            source = volume["secret"] or {}
            if source.get("items"):
                raise ImageError(f"volume {name}: secret items are not supported")
            group = ((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup")
            keys = SecretKeys(
                str(source["secretName"]),
                int(source.get("defaultMode", PROJECTED_FILE_MODE)),
                None if group is None else int(group),
            )
            volumes[name] = Volume(name, files=(keys,))
        else:
            kinds = sorted(set(volume) - {"name"})
            raise ImageError(f"volume {name}: {', '.join(kinds)} is not supported")
    return volumes


@dataclass(frozen=True)
class MountPoint:
    volume: str
    path: str
    read_only: bool = False
    sub_path: str = ""


@dataclass(frozen=True)
class Launch:
    """Everything about one container's start that follows from the pod and the image."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    identity: Identity
    working_dir: str
    read_only_root: bool
    volumes: tuple[Volume, ...] = ()
    mounts: tuple[MountPoint, ...] = ()
    hostname: str = ""


def container_launch(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    image: ImageConfig,
    api_server: tuple[str, int],
    secret: SecretValue | None = None,
) -> Launch:
    """How a kubelet starts `container` of `pod` from `image`, with the API server at
    `api_server` (host, port) for in-cluster configuration, and `secret` reading the
    Secrets its environment names."""
    own_env = container_env(pod, container, secret)
    env = dict(image.env) | own_env
    env.setdefault("PATH", DEFAULT_PATH)
    # As container runtimes do for a user the image's passwd may not know.
    env.setdefault("HOME", "/")
    env["HOSTNAME"] = str(pod["metadata"]["name"])
    env["KUBERNETES_SERVICE_HOST"] = api_server[0]
    env["KUBERNETES_SERVICE_PORT"] = str(api_server[1])
    volumes = pod_volumes(pod)
    mounts = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in volumes:
            raise ImageError(f"volumeMount {mount['name']}: no such volume")
        mounts.append(
            MountPoint(
                str(mount["name"]),
                str(mount["mountPath"]),
                bool(mount.get("readOnly")),
                str(mount.get("subPath") or ""),
            )
        )
    used = {m.volume for m in mounts}
    return Launch(
        argv=command_line(container, image, own_env),
        env=tuple(env.items()),
        identity=identity(pod, container, image),
        working_dir=str(container.get("workingDir") or image.working_dir or "/"),
        read_only_root=bool((container.get("securityContext") or {}).get("readOnlyRootFilesystem")),
        volumes=tuple(v for v in volumes.values() if v.name in used),
        mounts=tuple(mounts),
        hostname=str(pod["metadata"]["name"])[:63],
    )


# What every container gets, as runc's and crun's default specs give it.
_BASE_MOUNTS: Final = (
    {
        "destination": "/proc",
        "type": "proc",
        "source": "proc",
        "options": ["nosuid", "noexec", "nodev"],
    },
    {
        "destination": "/dev",
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
    },
    {
        "destination": "/dev/pts",
        "type": "devpts",
        "source": "devpts",
        "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
    },
    {
        "destination": "/dev/shm",
        "type": "tmpfs",
        "source": "shm",
        "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
    },
    {
        "destination": "/dev/mqueue",
        "type": "mqueue",
        "source": "mqueue",
        "options": ["nosuid", "noexec", "nodev"],
    },
    {
        "destination": "/sys",
        "type": "sysfs",
        "source": "sysfs",
        "options": ["nosuid", "noexec", "nodev", "ro"],
    },
)
# The host network namespace: a kubelet with hostNetwork mounts the host's name resolution.
_HOST_FILES: Final = ("/etc/hosts", "/etc/resolv.conf")
_MASKED: Final = (
    "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
)  # fmt: skip
_READ_ONLY: Final = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


def volume_source(volumes_dir: Path, mount: MountPoint) -> Path:
    source = volumes_dir / mount.volume
    return source / mount.sub_path if mount.sub_path else source


def runtime_config(launch: Launch, rootfs: Path, volumes_dir: Path) -> dict[str, Any]:
    """The OCI runtime configuration (config.json) of a container: `rootfs` is its root,
    `volumes_dir/<volume>` the directories the agent prepared for its volumes."""
    mounts: list[dict[str, Any]] = [dict(m) for m in _BASE_MOUNTS]
    mounts += [
        {
            "destination": path,
            "type": "bind",
            "source": path,
            "options": ["rbind", "ro", "nosuid", "nodev"],
        }
        for path in _HOST_FILES
    ]
    tmpfs = {v.name for v in launch.volumes if v.tmpfs}
    for mount in launch.mounts:
        access = "ro" if mount.read_only else "rw"
        if mount.volume in tmpfs and not mount.sub_path:
            mounts.append(
                {
                    "destination": mount.path,
                    "type": "tmpfs",
                    "source": "tmpfs",
                    "options": ["nosuid", "nodev", "mode=1777", access],
                }
            )
        else:
            mounts.append(
                {
                    "destination": mount.path,
                    "type": "bind",
                    "source": str(volume_source(volumes_dir, mount)),
                    "options": ["rbind", access, "nosuid", "nodev"],
                }
            )
    no_capabilities: dict[str, list[str]] = {
        kind: [] for kind in ("bounding", "effective", "inheritable", "permitted", "ambient")
    }
    user: dict[str, Any] = {"uid": launch.identity.uid, "gid": launch.identity.gid}
    if launch.identity.additional_gids:
        user["additionalGids"] = list(launch.identity.additional_gids)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": user,
            "args": list(launch.argv),
            "env": [f"{name}={value}" for name, value in launch.env],
            "cwd": launch.working_dir,
            "capabilities": no_capabilities,
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": launch.read_only_root},
        "hostname": launch.hostname,
        "mounts": mounts,
        "linux": {
            # No network namespace: the host's, where the pod's loopback address lives.
            "namespaces": [{"type": t} for t in ("pid", "mount", "ipc", "uts")],
            "maskedPaths": list(_MASKED),
            "readonlyPaths": list(_READ_ONLY),
        },
    }


@dataclass(frozen=True)
class Bundle:
    """A container's OCI bundle: its config, and an overlay of the image's root filesystem
    with a writable layer of its own."""

    directory: Path

    @property
    def rootfs(self) -> Path:
        return self.directory / "rootfs"

    @property
    def upper(self) -> Path:
        return self.directory / "upper"

    @property
    def work(self) -> Path:
        return self.directory / "work"


def crun_argv(
    crun: str,
    state_root: Path,
    container_id: str,
    bundle: Bundle,
    image_rootfs: Path,
    *,
    hide_unified_cgroup: bool,
) -> tuple[str, ...]:
    """The command that runs a container in the foreground: in a private mount namespace (so
    the overlay over the image dies with it), the overlay mounted, then `crun run` (which
    forwards SIGTERM to the container and exits with its status). No cgroup manager: the fake
    nodes have no resources to enforce."""
    overlay = f"lowerdir={image_rootfs},upperdir={bundle.upper},workdir={bundle.work}"
    steps = []
    if hide_unified_cgroup:
        steps.append(f"umount {shlex.quote(str(UNIFIED_CGROUP))}")
    steps.append(
        f"mount -t overlay overlay -o {shlex.quote(overlay)} {shlex.quote(str(bundle.rootfs))}"
    )
    steps.append('exec "$@"')
    return (
        "unshare", "--mount", "--propagation", "private", "--",
        "sh", "-euc", "; ".join(steps), "crun",
        crun, "--root", str(state_root), "--cgroup-manager=disabled",
        "run", "--bundle", str(bundle.directory), container_id,
    )  # fmt: skip


def delete_all(crun: str, state_root: Path) -> list[str]:
    """Remove every container crun knows under `state_root` (those of an agent that died
    without stopping them); returns their ids."""
    if not state_root.is_dir():
        return []
    ids = sorted(entry.name for entry in state_root.iterdir() if entry.is_dir())
    for found in ids:
        subprocess.run(
            [crun, "--root", str(state_root), "--cgroup-manager=disabled",
             "delete", "--force", found],
            capture_output=True, check=False,
        )  # fmt: skip
    return ids


def container_id(namespace: str, pod: str, uid: str) -> str:
    """crun's name for a pod's container: readable, unique per pod instance."""
    return f"{namespace}.{pod}.{uid[:8]}"


# I/O: the image store, the unpack cache, the host's cgroup layout.


class ImageStore:
    """OCI layouts under one directory, looked up by image reference."""

    def __init__(self, directory: Path, cache_dir: Path | None = None) -> None:
        self.directory = directory.resolve()
        self.cache_dir = cache_dir or default_cache_dir() / "image-rootfs"
        # Found images only: one built meanwhile is found on the next look.
        self._found: dict[str, Image] = {}

    def __str__(self) -> str:
        return str(self.directory)

    def find(self, reference: str) -> Image | None:
        if reference not in self._found:
            image = self._look_up(reference)
            if image is None:
                return None
            self._found[reference] = image
        return self._found[reference]

    def _look_up(self, reference: str) -> Image | None:
        layout = self.directory / layout_name(reference)
        index_path = layout / "index.json"
        if not index_path.is_file():
            return None
        index = json.loads(index_path.read_text())
        digest = manifest_for(index, reference)
        if digest is None:
            return None
        manifest = json.loads(_blob(layout, digest).read_text())
        config = json.loads(_blob(layout, manifest["config"]["digest"]).read_text())
        _, tag, _ = split_reference(reference)
        return Image(reference, layout, tag or "latest", digest, ImageConfig.from_oci(config))

    def rootfs(self, image: Image) -> Path:
        """The image's root filesystem, unpacked once per manifest digest (umoci)."""
        key = image.manifest_digest.removeprefix("sha256:")
        target = self.cache_dir / key
        complete = target / ".complete"
        if complete.exists():
            return target / "rootfs"
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with (self.cache_dir / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not complete.exists():
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir()
                source = f"{image.layout}:{image.tag}"
                result = subprocess.run(
                    ["umoci", "raw", "unpack", "--image", source, str(target / "rootfs")],
                    capture_output=True, text=True, check=False,
                )  # fmt: skip
                if result.returncode != 0:
                    raise ImageError(
                        f"umoci could not unpack {image.reference}: {result.stderr.strip()}"
                    )
                complete.touch()
        return target / "rootfs"


def _blob(layout: Path, digest: str) -> Path:
    if not _DIGEST.fullmatch(digest):
        raise ImageError(f"{layout}: unexpected digest {digest!r}")
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def default_cache_dir() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "inferfleet"


def unified_cgroup_has_controllers() -> bool:
    """Hybrid cgroups with controllers on the v2 side: what crun refuses."""
    controllers = UNIFIED_CGROUP / "cgroup.controllers"
    try:
        return bool(controllers.read_text().strip())
    except OSError:
        return False
