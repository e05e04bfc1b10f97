"""The weight cache (`spec.model.cache`): what it renders, what the replicas read, the cold
start it predicts, the fill's status and condition, and the fill's own pure parts."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from inferfleet.api.model_deployment import ModelDeploymentSpec, ModelDeploymentStatus, Role
from inferfleet.api.model_spec import WeightSource
from inferfleet.api.weight_cache import FillPhase, WeightCacheStatus
from inferfleet.devcluster.hub import ModelHub, RunningHub
from inferfleet.engines import EngineOptions
from inferfleet.planning.capacity import plan
from inferfleet.reconcile.desired import Child, Namespace, ObjectKey, model_deployment_outcome
from inferfleet.reconcile.entries import child_of
from inferfleet.reconcile.fill import ClaimState, JobState, fill_state, weight_cache_status
from inferfleet.render import InstallSettings, render_model_deployment
from inferfleet.render.weight_cache import (
    FILLED_MARKER,
    FillReport,
    push_body,
    pushed_progress,
)
from inferfleet.weights import _Progress, files_to_fill, fill, wait
from tests.unit.golden.specs import aggregated_spec, model_deployment

Objects = list[dict[str, Any]]
SOURCE = "hf://meta-llama/Llama-3.1-8B-Instruct"
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def cached(engine: str = "vllm", **cache: Any) -> ModelDeploymentSpec:
    return aggregated_spec(model={"source": SOURCE, "cache": cache}, engine={"name": engine})


def render(spec: ModelDeploymentSpec, **kwargs: Any) -> Objects:
    return render_model_deployment(model_deployment(spec), **kwargs)


def one(objects: Objects, kind: str) -> dict[str, Any]:
    [found] = [o for o in objects if o["kind"] == kind]
    return found


def engine_pod(objects: Objects) -> dict[str, Any]:
    pod: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return pod


# What it renders -------------------------------------------------------------------------


def test_a_cache_renders_its_volume_fill_and_the_fills_narrow_grant() -> None:
    objects = render(cached(size="40Gi", storageClassName="shared-nfs"))
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "40Gi"}},
        "storageClassName": "shared-nfs",
    }
    job = one(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    [fill] = pod["containers"]
    assert fill["command"] == ["inferfleet", "weights"]
    assert fill["args"][:5] == [
        "fill", "--source", SOURCE, "--directory", "/weights/meta-llama/Llama-3.1-8B-Instruct",
    ]  # fmt: skip
    progress = one(objects, "ConfigMap")["metadata"]["name"]
    assert fill["args"][5:] == ["--progress-config-map", progress]
    assert "data" not in one(objects, "ConfigMap")  # the fill's, never the operator's
    assert pod["volumes"] == [
        {"name": "weight-cache", "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]}}
    ]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert one(objects, "Role")["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [progress],
            "verbs": ["get", "patch"],
        }
    ]
    # Owned by the deployment: deleted with it.
    for obj in (claim, job):
        assert obj["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"


def test_the_fill_runs_where_the_replicas_run_and_asks_for_no_gpu() -> None:
    spec = cached()
    objects = render(
        spec.model_copy(
            update={
                "scheduling": aggregated_spec(scheduling={"nodeSelector": {"zone": "a"}}).scheduling
            }
        )
    )
    fill_pod = one(objects, "Job")["spec"]["template"]["spec"]
    engine = engine_pod(objects)
    assert fill_pod["nodeSelector"] == engine["nodeSelector"]
    assert fill_pod["tolerations"] == engine["tolerations"]
    assert "nvidia.com/gpu" not in str(fill_pod["containers"][0]["resources"])


def test_replicas_read_the_volume_and_wait_for_the_fill() -> None:
    objects = render(cached())
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    pod = engine_pod(objects)
    [wait_container] = pod["initContainers"]
    assert wait_container["args"] == [
        "wait", "--directory", "/weights/meta-llama/Llama-3.1-8B-Instruct",
    ]  # fmt: skip
    assert wait_container["volumeMounts"][0]["readOnly"] is True
    claims = {
        v["name"]: v["persistentVolumeClaim"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert all(c == {"claimName": claim, "readOnly": True} for c in claims.values())
    [engine] = pod["containers"]
    # vLLM reads the directory, from the claim; it downloads nothing, so needs no token.
    assert engine["args"][0] == "/model-source/meta-llama/Llama-3.1-8B-Instruct"
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in engine["env"]
    assert "HF_TOKEN" not in str(engine["env"])


def test_without_a_cache_nothing_of_it_is_rendered() -> None:
    objects = render(aggregated_spec())
    assert {o["kind"] for o in objects}.isdisjoint({"PersistentVolumeClaim", "Job"})
    assert "initContainers" not in engine_pod(objects)


def test_another_source_or_class_is_another_volume_and_an_image_change_another_job() -> None:
    base = render(cached())
    other_source = render(
        aggregated_spec(model={"source": "hf://meta-llama/Llama-3.1-8B", "cache": {}})
    )
    other_class = render(cached(storageClassName="fast"))
    resized = render(cached(size="99Gi"))

    def name(objects: Objects, kind: str) -> str:
        return str(one(objects, kind)["metadata"]["name"])

    claims = {name(o, "PersistentVolumeClaim") for o in (base, other_source, other_class)}
    assert len(claims) == 3
    # A size is changed in place (a class that allows it expands the volume).
    assert name(resized, "PersistentVolumeClaim") == name(base, "PersistentVolumeClaim")
    newer = render(cached(), options=EngineOptions(weights_image="registry.example/inferfleet:2"))
    assert name(newer, "Job") != name(base, "Job")
    assert one(newer, "Job")["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/inferfleet:2"
    )


def test_the_default_size_is_the_16_bit_checkpoint_plus_headroom() -> None:
    spec = cached()
    parameters = spec.architecture().parameter_count
    size = one(render(spec), "PersistentVolumeClaim")["spec"]["resources"]["requests"]["storage"]
    assert size == f"{math.ceil(parameters * 2 * 1.1 / 2**30)}Gi"
    assert 15 <= int(size.removesuffix("Gi")) <= 20  # 8B parameters


def test_the_rollout_deadline_allows_for_the_fill() -> None:
    deadline = one(render(cached()), "Deployment")["spec"]["progressDeadlineSeconds"]
    plain = one(render(aggregated_spec()), "Deployment")["spec"]["progressDeadlineSeconds"]
    download = plan(aggregated_spec()).cold_start
    assert download is not None
    assert download.download_s > 0
    # A first replica waits for the whole fill: the hub download the plain spec would make
    # at its start (an 8B checkpoint stays within the install's startup budget either way).
    assert deadline - plain == math.ceil(download.download_s)


@pytest.mark.parametrize(
    ("reported", "allowed"),
    [
        (FillPhase.FILLED, False),  # filled: a later rollout waits for no fill
        (FillPhase.FILLING, True),
        (None, True),  # another source's volume was filled, not this one
    ],
)
def test_the_fill_allowance_lasts_until_the_status_reports_this_volume_filled(
    reported: FillPhase | None, allowed: bool
) -> None:
    spec = cached()
    claim = one(render(spec), "PersistentVolumeClaim")["metadata"]["name"]
    status = ModelDeploymentStatus(
        weight_cache=WeightCacheStatus(
            claim=claim if reported else "llama-weights-0000000000",
            source=SOURCE,
            phase=reported or FillPhase.FILLED,
            size="16Gi",
        )
    )
    md = model_deployment(spec).model_copy(update={"status": status})
    deadline = one(render_model_deployment(md), "Deployment")["spec"]["progressDeadlineSeconds"]
    plain = one(render(aggregated_spec()), "Deployment")["spec"]["progressDeadlineSeconds"]
    assert (deadline > plain) is allowed


# The plan and the policy -----------------------------------------------------------------


def test_a_cached_source_starts_from_the_volume() -> None:
    spec = cached()
    assert spec.model.weight_source is WeightSource.CACHE
    estimate = plan(spec).cold_start
    from_hub = plan(aggregated_spec()).cold_start
    assert estimate is not None
    assert from_hub is not None
    assert estimate.source is WeightSource.CACHE
    assert estimate.download_s == 0
    assert estimate.seconds < from_hub.seconds


# The fill's state and the status ---------------------------------------------------------


def job_body(name: str, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "status": status}


def test_fill_state_reads_the_job_the_volume_and_the_push() -> None:
    assert fill_state(job_body("j", active=1)) == JobState()
    assert fill_state(
        job_body(
            "j",
            succeeded=1,
            completionTime="2026-11-29T12:00:00Z",
            conditions=[{"type": "Complete", "status": "True"}],
        )
    ) == JobState(complete=True, completion_time="2026-11-29T12:00:00Z")
    failed = fill_state(
        job_body(
            "j",
            conditions=[
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "Job has reached the specified backoff limit"}
            ],
        )
    )  # fmt: skip
    assert failed == JobState(
        failure="BackoffLimitExceeded: Job has reached the specified backoff limit"
    )
    assert fill_state({"kind": "PersistentVolumeClaim", "status": {"phase": "Bound"}}) == (
        ClaimState("Bound")
    )
    report = FillReport("j", 100, 40, "abc123")
    assert fill_state({"kind": "ConfigMap", **push_body(report, NOW)}) == report
    assert fill_state({"kind": "ConfigMap", "data": {"bytesTotal": "x"}}) is None


@pytest.mark.parametrize(
    ("held", "phase", "says"),
    [
        ({}, FillPhase.PENDING, "volume is not created yet"),
        ({"claim": ClaimState("Pending")}, FillPhase.PENDING, "volume is Pending"),
        ({"progress": FillReport("JOB", 16_000_000_000, 4_000_000_000, "abc")},
         FillPhase.FILLING, "4.00 of 16.00 GB on the volume (25%)"),
        # An older Job's push is not this fill's.
        ({"progress": FillReport("older", 10, 5, "abc")}, FillPhase.PENDING, "not started"),
        ({"JOB": JobState(complete=True, completion_time="t")}, FillPhase.FILLED, "filled"),
        ({"JOB": JobState(failure="BackoffLimitExceeded: no")}, FillPhase.FAILED,
         "the fill failed: BackoffLimitExceeded: no"),
    ],
)  # fmt: skip
def test_weight_cache_status(held: dict[str, Any], phase: FillPhase, says: str) -> None:
    objects = render(cached())
    job = one(objects, "Job")["metadata"]["name"]
    claim = one(objects, "PersistentVolumeClaim")["metadata"]["name"]
    names = {"JOB": job, "claim": claim, "progress": "progress"}
    held = {names[key]: _for_job(value, job) for key, value in held.items()}
    status = weight_cache_status(objects, held, SOURCE)
    assert status is not None
    assert status.phase == phase
    assert says in status.message
    assert status.claim == claim
    assert status.source == SOURCE


def _for_job(value: Any, job: str) -> Any:
    return (
        replace(value, job=job) if isinstance(value, FillReport) and value.job == "JOB" else value
    )


def md_body(spec: ModelDeploymentSpec) -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "serving", "uid": "uid-md", "generation": 1},
        "spec": spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


def outcome(spec: ModelDeploymentSpec, children: list[Child]) -> Any:
    return model_deployment_outcome(
        md_body(spec), space=Namespace(children=children, holder=lambda _key: None),
        claims=(), unschedulable={}, install=InstallSettings(), now=NOW,
    )  # fmt: skip


def test_the_status_says_the_replicas_wait_for_the_fill_then_that_it_is_filled() -> None:
    spec = cached()
    first = outcome(spec, [])
    conditions = {c["type"]: c for c in first.status["conditions"]}
    assert conditions["WeightsCached"]["status"] == "False"
    assert conditions["WeightsCached"]["reason"] == "FillPending"
    assert conditions["Ready"]["reason"] == "WeightsNotCached"
    assert first.status["weightCache"]["phase"] == "Pending"
    applied = {o["kind"] for o in first.apply}
    assert {"PersistentVolumeClaim", "Job", "ConfigMap", "Role"} <= applied

    job = one(list(first.apply), "Job")
    done = {**job, "metadata": {**job["metadata"]}, "status": {"succeeded": 1,
            "conditions": [{"type": "Complete", "status": "True"}]}}  # fmt: skip
    child = child_of("serving", done)
    assert child is not None
    assert isinstance(child.fill, JobState)
    later = outcome(spec, [child])
    conditions = {c["type"]: c for c in later.status["conditions"]}
    assert conditions["WeightsCached"]["status"] == "True"
    assert conditions["WeightsCached"]["reason"] == "Filled"
    assert conditions["Ready"]["reason"] == "ReplicasNotReady"  # now the replicas' own turn
    assert later.status["weightCache"]["phase"] == "Filled"


def test_a_push_is_news_for_the_deployment() -> None:
    base = Child(key=ObjectKey("v1", "ConfigMap", "p"), owner_uid="u", applied_hash=None)
    first = replace(base, fill=FillReport("j", 10, 1, "r"))
    second = replace(base, fill=FillReport("j", 10, 2, "r"))
    assert first.read_by_owner != second.read_by_owner


def test_pushed_progress_round_trips_and_refuses_what_it_cannot_read() -> None:
    report = FillReport(
        "fill-1", 16_060_000_000, 5_000_000_000, "0e9e39f249a16976918f6564b8830bc894c89659"
    )
    assert pushed_progress(push_body(report, NOW)) == report
    assert pushed_progress({"data": {"bytesTotal": "10", "bytesFilled": "-1", "job": "j"}}) is None
    assert pushed_progress({}) is None


def test_a_cache_needs_a_hub_source() -> None:
    with pytest.raises(ValueError, match="needs an hf:// source"):
        aggregated_spec(model={"source": "pvc://weights/llama", "cache": {}})


# The fill's pure parts -------------------------------------------------------------------


def test_only_what_a_replica_reads_is_filled() -> None:
    names = [
        "config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json", "pytorch_model.bin", "original/consolidated.00.pth",
        "tokenizer.json", "generation_config.json", "README.md",
    ]  # fmt: skip
    assert files_to_fill(names) == sorted(
        n for n in names if n not in ("pytorch_model.bin", "original/consolidated.00.pth")
    )
    # Without safetensors the .bin weights are the checkpoint.
    assert "pytorch_model.bin" in files_to_fill(["config.json", "pytorch_model.bin"])


def test_progress_is_pushed_at_most_every_few_seconds_and_always_at_the_end() -> None:
    pushed: list[FillReport] = []
    progress = _Progress("j", "r", total=300, filled=0, push=pushed.append)
    progress.add(0, final=True)
    for _ in range(3):
        progress.add(100)
    assert [r.bytes_filled for r in pushed] == [0]  # within the interval
    progress.add(0, final=True)
    assert [r.bytes_filled for r in pushed] == [0, 300]


def test_a_failed_push_does_not_stop_the_fill() -> None:
    def refuse(_report: FillReport) -> None:
        raise RuntimeError("forbidden")

    progress = _Progress("j", "r", total=10, filled=0, push=refuse)
    progress.add(10, final=True)
    assert progress.report.bytes_filled == 10


def test_wait_returns_once_the_marker_is_there(tmp_path: Path) -> None:
    naps: list[float] = []

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            (tmp_path / FILLED_MARKER).write_text("{}")

    wait(tmp_path, poll_s=0.5, sleep=nap)
    assert naps == [0.5, 0.5, 0.5]


def test_roles_are_unchanged_by_a_cache() -> None:
    assert {Role.AGGREGATED} == {
        Role(d["metadata"]["labels"]["inferfleet.io/role"])
        for d in render(cached())
        if d["kind"] == "Deployment"
    }


# The fill against a hub on loopback -------------------------------------------------------


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModelHub, Path]]:
    repo = tmp_path / "hub" / "acme" / "tiny"
    (repo / "original").mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "llama"}')
    (repo / "model-00001-of-00002.safetensors").write_bytes(bytes(range(256)) * 1200)
    (repo / "model-00002-of-00002.safetensors").write_bytes(bytes(range(256)) * 800)
    (repo / "original" / "consolidated.00.pth").write_bytes(b"\0" * 5000)
    model_hub = ModelHub(tmp_path / "hub", fail_after=100_000)
    running = RunningHub(model_hub)
    monkeypatch.setenv("HF_ENDPOINT", running.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield model_hub, repo
    running.close()


def test_a_fill_downloads_what_replicas_read_through_a_cut_and_resumes_for_nothing(
    hub: tuple[ModelHub, Path], tmp_path: Path
) -> None:
    model_hub, repo = hub
    target = tmp_path / "volume" / "acme" / "tiny"
    pushed: list[FillReport] = []
    report = fill("hf://acme/tiny", target, job="fill-1", push=pushed.append)
    served = {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    for name in served:
        assert (target / name).read_bytes() == (repo / name).read_bytes()
    assert not (target / "original" / "consolidated.00.pth").exists()
    total = sum((repo / name).stat().st_size for name in served)
    assert report.bytes_total == report.bytes_filled == total
    assert report.revision == model_hub.commit("acme/tiny")
    assert pushed[0].bytes_filled == 0
    assert pushed[-1] == report
    marker = json.loads((target / FILLED_MARKER).read_text())
    assert marker["revision"] == report.revision
    assert marker["bytes"] == total
    # Both shards were cut once, and fetched again whole.
    assert model_hub.served["model-00001-of-00002.safetensors"] > 307_200

    before = dict(model_hub.served)
    again = fill("hf://acme/tiny", target, job="fill-2")
    assert again.bytes_filled == total
    assert model_hub.served == before  # nothing fetched twice


def test_a_cache_taken_out_of_the_spec_is_deleted_and_its_status_cleared() -> None:
    first = outcome(cached(), [])
    children = [c for o in first.apply if (c := child_of("serving", _owned(o))) is not None]
    assert {"PersistentVolumeClaim", "Job"} <= {c.key.kind for c in children}
    body = md_body(aggregated_spec(engine={"name": "vllm"}))
    body["status"] = first.status
    later = model_deployment_outcome(
        body, space=Namespace(children=children, holder=lambda _key: None),
        claims=(), unschedulable={}, install=InstallSettings(), now=NOW,
    )  # fmt: skip
    deleted = {key.kind for key in later.delete}
    assert {"PersistentVolumeClaim", "Job", "ServiceAccount", "Role", "RoleBinding"} <= deleted
    assert later.status is not None
    assert later.status["weightCache"] is None
    assert "WeightsCached" not in {c["type"] for c in later.status["conditions"]}


def _owned(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server stores it for the deployment `md_body` makes."""
    reference = {"apiVersion": "inferfleet.io/v1alpha1", "kind": "ModelDeployment",
                 "name": "llama", "uid": "uid-md", "controller": True}  # fmt: skip
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [reference]}}
