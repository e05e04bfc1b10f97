"""A ModelDeployment's weight cache (`spec.model.cache`), rendered: the volume, the Job that
fills it once, and what the fill pushes its progress to.

- **The volume.** A PersistentVolumeClaim named after the deployment and a digest of what
  fixes its contents and kind (the source, the StorageClass, the access mode: fields a claim
  cannot change once created). Another source gets another volume, filled anew, and the old
  one is deleted once nothing renders it (a claim still mounted by a pod is kept by the API
  server until that pod is gone, so the replicas being replaced keep reading theirs).
- **The fill.** A Job (`inferfleet weights fill`, the install's image) downloads the weights
  into `/weights/<org>/<repo>` of the volume and writes a marker file last. It resumes: a file
  already whole is not fetched again, a partial one continues, so a restarted pod or a new
  Job loses no more than the file in flight. It runs where the replicas run (the GPU type's
  nodes and taint, the spec's scheduling), so that a volume one node mounts serves them, and
  asks for no GPU. Its name carries a digest of its pod template, which a Job cannot change:
  a changed template is a new Job that finds the files in place.
- **The replicas.** They read the weights from the volume (the source as `pvc://`), and an
  init container (`inferfleet weights wait`) holds each until the marker is there: a replica
  of a new source waits for its fill while the replicas it replaces serve on.
- **Progress.** The fill pushes its counts by merge patch to a ConfigMap the operator renders
  (metadata only) and lets the fill's own ServiceAccount `get` and `patch` by name, nothing
  else; the operator watches it, as it watches the router's wake ConfigMap (`render.wake`),
  and reports the fill in `status.weightCache`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec
from inferfleet.api.model_spec import WeightSource
from inferfleet.api.weight_cache import FillPhase, WeightCache, WeightCacheStatus
from inferfleet.engines import EngineOptions
from inferfleet.engines.common import hub_env
from inferfleet.planning.coldstart import estimate_cold_start
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.render.common import (
    LABEL_COMPONENT,
    LABEL_NAME,
    Owner,
    account_role_binding,
    container_security_context,
    dns_label,
    object_meta,
    pod_security_context,
    spec_hash,
)

WEIGHTS_DIR: Final = "/weights"
"""Where the fill mounts the volume (writable)."""
CACHE_VOLUME: Final = "weight-cache"
FILLED_MARKER: Final = ".inferfleet-filled.json"
"""Written into the weights' directory when every file is whole: what the replicas wait for."""
WEIGHT_CACHE_APP: Final = "inferfleet-weight-cache"
FILL_CONTAINER: Final = "fill"
WAIT_CONTAINER: Final = "wait-for-weights"
FILL_UID: Final = 65532
"""The images' nonroot user (fsGroup makes the volume writable for it)."""
FILL_BACKOFF_LIMIT: Final = 10
"""Restarts before the Job fails: each resumes where the last stopped."""
CHECKPOINT_BYTES_PER_PARAMETER: Final = 2
"""A hub's checkpoint is mostly 16-bit; a quantized one takes less."""
SIZE_HEADROOM: Final = 1.10
GIB: Final = 1024**3

# What the fill pushes (`push_body`) and the operator reads (`pushed_progress`).
JOB_KEY: Final = "job"
BYTES_TOTAL_KEY: Final = "bytesTotal"
BYTES_FILLED_KEY: Final = "bytesFilled"
REVISION_KEY: Final = "revision"
MESSAGE_KEY: Final = "message"
PUSHED_AT_KEY: Final = "pushedAt"


def hub_repository(source: str) -> str:
    """`org/repo` of an `hf://org/repo` source: also where its files lie on the volume,
    relative to its root."""
    return source.partition("://")[2].strip("/")


def cache_claim_name(deployment: str, source: str, cache: WeightCache) -> str:
    digest = spec_hash(
        {"source": source, "class": cache.storage_class_name, "mode": cache.access_mode.value}
    )[:8]
    return dns_label(f"{deployment}-weights-{digest}")


def progress_config_map_name(deployment: str) -> str:
    return dns_label(f"{deployment}-weights-fill")


def fill_account_name(deployment: str) -> str:
    return dns_label(f"{deployment}-weights-fill")


def cache_size(spec: ModelDeploymentSpec, cache: WeightCache) -> str:
    """The volume's size: as given, else the 16-bit checkpoint plus headroom, in GiB."""
    if cache.size is not None:
        return cache.size
    parameters = spec.architecture().parameter_count
    return f"{math.ceil(parameters * CHECKPOINT_BYTES_PER_PARAMETER * SIZE_HEADROOM / GIB)}Gi"


def cached_spec(spec: ModelDeploymentSpec, claim: str) -> ModelDeploymentSpec:
    """The spec as the engines see it: the weights read from the cache's volume."""
    source = f"pvc://{claim}/{hub_repository(spec.model.source)}"
    return spec.model_copy(update={"model": spec.model.model_copy(update={"source": source})})


@dataclass(frozen=True)
class WeightCacheObjects:
    """What one deployment's cache renders, and what its replicas' pods get."""

    claim: str
    objects: list[dict[str, Any]]
    wait_container: dict[str, Any]
    volume: dict[str, Any]
    fill_seconds: int
    """The fill's estimated length (the hub download of the whole checkpoint); 0 once the
    status reports this volume filled."""


def cache_labels(base: Mapping[str, str]) -> dict[str, str]:
    """The deployment's labels, named apart from its engines (no engine selector, network
    policy or Service takes the fill's pod for one)."""
    return {**base, LABEL_NAME: WEIGHT_CACHE_APP, LABEL_COMPONENT: "weight-cache"}


def render_weight_cache(
    owner: Owner,
    spec: ModelDeploymentSpec,
    *,
    filled: WeightCacheStatus | None,
    labels: Mapping[str, str],
    placement_pod: Mapping[str, Any],
    options: EngineOptions,
    gpus: GpuCatalog,
) -> WeightCacheObjects | None:
    """The cache's objects, or None where the spec asks for none. `filled`: the fill as the
    status last reported it (a volume reported filled needs no fill time in any later
    rollout's deadline); `placement_pod`: the replicas' node selector, affinity and
    tolerations, which the fill runs under."""
    cache = spec.model.cache
    if cache is None:
        return None
    source = spec.model.source
    claim = cache_claim_name(owner.name, source, cache)
    size = cache_size(spec, cache)
    labels = cache_labels(labels)
    directory = f"{WEIGHTS_DIR}/{hub_repository(source)}"
    account = fill_account_name(owner.name)
    progress = progress_config_map_name(owner.name)
    claim_spec: dict[str, Any] = {
        "accessModes": [cache.access_mode.value],
        "resources": {"requests": {"storage": size}},
    }
    if cache.storage_class_name is not None:
        claim_spec["storageClassName"] = cache.storage_class_name
    fill = {
        **_tool_container(FILL_CONTAINER, options.weights_image, readonly=False),
        "args": [
            *("fill", "--source", source, "--directory", directory),
            *("--progress-config-map", progress),
        ],
        "env": _fill_env(options),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
    }
    pod: dict[str, Any] = {
        **{k: v for k, v in placement_pod.items() if k in _PLACEMENT_FIELDS},
        "serviceAccountName": account,
        "restartPolicy": "OnFailure",
        "enableServiceLinks": False,
        "securityContext": pod_security_context(FILL_UID),
        "containers": [fill],
        "volumes": [{"name": CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}}],
    }
    template = {"metadata": {"labels": dict(sorted(labels.items()))}, "spec": pod}
    job_name = dns_label(f"{owner.name}-weights-fill-{spec_hash(template)[:8]}")
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": object_meta(account, owner, labels)},
        _fill_role(owner, account, progress, labels),
        account_role_binding(account, owner, labels),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": object_meta(progress, owner, labels)},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": object_meta(claim, owner, labels), "spec": claim_spec},
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": object_meta(job_name, owner, labels),
         "spec": {"backoffLimit": FILL_BACKOFF_LIMIT, "template": template}},
    ]  # fmt: skip
    wait = {
        **_tool_container(WAIT_CONTAINER, options.weights_image, readonly=True),
        "args": ["wait", "--directory", directory],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }
    volume = {
        "name": CACHE_VOLUME,
        "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
    }
    if filled is not None and filled.claim == claim and filled.phase is FillPhase.FILLED:
        return WeightCacheObjects(claim, objects, wait, volume, 0)
    config = ReplicaConfig.from_spec(spec, gpus)
    download = estimate_cold_start(config, WeightSource.NETWORK, spec.engine.name).download_s
    return WeightCacheObjects(claim, objects, wait, volume, math.ceil(download))


_PLACEMENT_FIELDS: Final = (
    "nodeSelector", "affinity", "tolerations", "priorityClassName", "imagePullSecrets",
)  # fmt: skip


def _fill_env(options: EngineOptions) -> list[dict[str, Any]]:
    """The fill's namespace and Job (to push its progress, and say which fill pushed it),
    and what a download from the hub needs."""
    return [
        {"name": "POD_NAMESPACE", "valueFrom": _field("metadata.namespace")},
        {"name": "JOB_NAME", "valueFrom": _field("metadata.labels['job-name']")},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        *hub_env(options),
    ]


def _field(path: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": path}}


def _tool_container(name: str, image: str, *, readonly: bool) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "command": ["inferfleet", "weights"],
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": CACHE_VOLUME, "mountPath": WEIGHTS_DIR, "readOnly": readonly}],
    }


def _fill_role(
    owner: Owner, account: str, progress: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(account, owner, labels),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [progress],
                "verbs": ["get", "patch"],
            }
        ],
    }


@dataclass(frozen=True)
class FillReport:
    """What a fill last pushed: its Job, the bytes listed and on the volume, the commit."""

    job: str
    bytes_total: int
    bytes_filled: int
    revision: str
    message: str = ""

    def describe(self) -> str:
        if self.message:
            return self.message
        share = self.bytes_filled / self.bytes_total if self.bytes_total else 1.0
        return (
            f"{self.bytes_filled / 1e9:.2f} of {self.bytes_total / 1e9:.2f} GB on the volume "
            f"({share:.0%}), revision {self.revision[:12]}"
        )


def push_body(report: FillReport, now: datetime) -> dict[str, Any]:
    """The merge patch a fill sends to push `report`."""
    return {
        "data": {
            JOB_KEY: report.job,
            BYTES_TOTAL_KEY: str(report.bytes_total),
            BYTES_FILLED_KEY: str(report.bytes_filled),
            REVISION_KEY: report.revision,
            MESSAGE_KEY: report.message,
            PUSHED_AT_KEY: now.astimezone(UTC).isoformat(timespec="milliseconds"),
        }
    }


def pushed_progress(config_map: Mapping[str, Any]) -> FillReport | None:
    """The report a fill pushed, from the ConfigMap as the API server stores it (None: none
    pushed, or not readable)."""
    data = config_map.get("data") or {}
    total, filled = data.get(BYTES_TOTAL_KEY), data.get(BYTES_FILLED_KEY)
    job = data.get(JOB_KEY)
    if not (isinstance(total, str) and total.isdigit() and isinstance(filled, str)):
        return None
    if not filled.isdigit() or not isinstance(job, str) or not job:
        return None
    return FillReport(
        job=job,
        bytes_total=int(total),
        bytes_filled=int(filled),
        revision=str(data.get(REVISION_KEY) or ""),
        message=str(data.get(MESSAGE_KEY) or ""),
    )
