"""The dev cluster's volumes: the provisioner's decisions, and a weight cache's pods as the
fleet agent runs them (the volume's directory in place of its mount, the init container
first, no address for the fill)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from inferfleet.devcluster.pod_process import Kind, host_path, pod_process
from inferfleet.devcluster.podspec import container_env
from inferfleet.devcluster.volumes import (
    STORAGE_CLASS,
    claim_directory,
    released,
    volume_for,
    wants_volume,
)
from inferfleet.render import render_model_deployment
from tests.unit.golden.specs import aggregated_spec, model_deployment

EXECUTABLE = "/venv/bin/inferfleet"
Wire = dict[str, Any]


def claim(**changes: Any) -> Wire:
    base: Wire = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "llama-weights-1", "namespace": "llm", "uid": "u-1"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "20Gi"}},
            "storageClassName": STORAGE_CLASS,
        },
        "status": {"phase": "Pending"},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return base


def test_a_pending_claim_of_the_class_gets_a_bound_volume_of_its_size_and_modes() -> None:
    wanted = claim()
    assert wants_volume(wanted)
    directory = claim_directory(Path("/state/volumes"), wanted)
    assert directory == Path("/state/volumes/llm_llama-weights-1_u-1")
    volume = volume_for(wanted, directory)
    assert volume["spec"]["capacity"] == {"storage": "20Gi"}
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["hostPath"]["path"] == str(directory)
    assert volume["spec"]["claimRef"] == {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "llm",
        "name": "llama-weights-1", "uid": "u-1",
    }  # fmt: skip


@pytest.mark.parametrize(
    "changes",
    [
        {"spec": {"storageClassName": "fast-nfs"}},
        {"spec": {"volumeName": "pvc-u-1"}},
        {"status": {"phase": "Bound"}},
        {"metadata": {"deletionTimestamp": "2026-11-29T00:00:00Z"}},
    ],
)
def test_other_claims_are_left_alone(changes: dict[str, Any]) -> None:
    assert not wants_volume(claim(**changes))


def test_only_its_own_released_volumes_are_deleted() -> None:
    own = volume_for(claim(), Path("/state/volumes/x"))
    assert not released(own)
    assert released({**own, "status": {"phase": "Released"}})
    other = copy.deepcopy(own)
    other["metadata"]["annotations"] = {}
    assert not released({**other, "status": {"phase": "Released"}})


def running(pod_template: Wire, name: str) -> Wire:
    return {
        "metadata": {**pod_template["metadata"], "name": name, "namespace": "llm", "uid": name},
        "spec": pod_template["spec"],
        "status": {"phase": "Running", "podIP": "127.1.0.9"},
    }


def cached_objects() -> list[Wire]:
    spec = aggregated_spec(model={"source": "hf://acme/tiny", "cache": {}}, engine={"name": "sim"})
    return render_model_deployment(model_deployment(spec))


def test_the_fill_runs_with_the_volumes_directory_and_its_service_account() -> None:
    objects = cached_objects()
    [job] = [o for o in objects if o["kind"] == "Job"]
    pod = running(job["spec"]["template"], "fill-abc")
    pod["metadata"]["labels"]["job-name"] = "llama-weights-fill-1"
    served = Path("/state/volumes/llm_claim_u")
    process = pod_process(pod, EXECUTABLE, lambda _claim: served)
    assert process is not None
    assert process.kind == Kind.WEIGHTS
    assert process.argv[:6] == (
        EXECUTABLE, "weights", "fill", "--source", "hf://acme/tiny",
        "--directory",
    )  # fmt: skip
    assert process.argv[6] == str(served / "acme" / "tiny")
    assert "--host" not in process.argv  # nothing listens
    assert process.service_account == job["spec"]["template"]["spec"]["serviceAccountName"]
    assert process.env["JOB_NAME"] == "llama-weights-fill-1"
    assert "HF_TOKEN" not in process.env  # optional, and no Secret is read here


def test_a_replica_waits_for_the_fill_in_its_init_container() -> None:
    objects = cached_objects()
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    served = Path("/state/volumes/llm_claim_u")
    process = pod_process(running(deployment["spec"]["template"], "engine-0"), EXECUTABLE,
                          lambda _claim: served)  # fmt: skip
    assert process is not None
    assert process.kind == Kind.ENGINE
    assert process.init == (
        (EXECUTABLE, "weights", "wait", "--directory", str(served / "acme" / "tiny")),
    )


def test_a_claim_not_bound_yet_holds_the_pod() -> None:
    [job] = [o for o in cached_objects() if o["kind"] == "Job"]
    with pytest.raises(ValueError, match="not bound"):
        pod_process(running(job["spec"]["template"], "fill-abc"), EXECUTABLE, lambda _c: None)


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        ("/weights/acme/tiny", "/host/v/acme/tiny"),
        ("--directory=/weights/acme", "--directory=/host/v/acme"),
        ("/weights", "/host/v"),
        ("/weightsx/a", "/weightsx/a"),
        ("--model", "--model"),
    ],
)
def test_host_path(arg: str, expected: str) -> None:
    assert host_path(arg, {"/weights": Path("/host/v")}) == expected


def test_an_optional_secret_key_that_is_not_there_leaves_the_variable_unset() -> None:
    reference = {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}
    container = {"env": [{"name": "HF_TOKEN", "valueFrom": reference}]}

    def missing(_name: str, _key: str) -> str:
        raise ValueError("no such Secret")

    assert container_env({}, container) == {}
    assert container_env({}, container, missing) == {}
    required = {"env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(ValueError, match="no such Secret"):
        container_env({}, required, missing)
