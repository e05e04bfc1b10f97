"""What every engine adapter shares: the container's contract, model sources, probes, refusals.

An adapter turns a `ModelDeploymentSpec` and a role into an `EngineContainer`: the container
(wire form), the volumes it mounts, the config files it reads and the facts the renderer needs
(GPUs, metrics path, user). Pure: no I/O, no Kubernetes client; equal inputs give equal output.

Contract with the renderer:
* the engine listens on `ENGINE_PORT`, port name `http`, and answers `GET /health`;
* every volume the container mounts is in `EngineContainer.volumes`, except `engine-config`:
  the renderer binds that one to the ConfigMap it makes from `config_files`, mounted at
  `ENGINE_CONFIG_DIR`;
* resources are not set here: the renderer sets them from `gpus`
  (`render.model_deployment.engine_resources`).

Model sources (`spec.model.source`, `speculativeDecoding.draftModel`):
* `hf://org/repo`: the repo id is the model argument; weights download into the model cache
  (`HF_HOME=/models`, an emptyDir), with the token read from a Secret by reference only
  (`optional: true`, so public models need no Secret);
* `pvc://claim/path`: the claim is mounted read-only and the engine reads `/model-source/path`;
  the hub is switched off (`HF_HUB_OFFLINE=1`) when nothing comes from it;
* `s3://` and `oci://` are refused with `UnsupportedSpecError` for now: an init container
  that copies weights needs credentials and a copy tool in the image, and OCI image volumes
  need a feature gate. Copy the weights to a volume and use `pvc://`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Final

from inferfleet import __version__
from inferfleet.api.catalog import catalog_models
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    PrecisionSpec,
    SpeculativeMethod,
    WeightPrecision,
)
from inferfleet.api.model_spec import WeightSource

ENGINE_PORT: Final = 8000
PORT_NAME: Final = "http"
API_KEY_ENV: Final = "VLLM_API_KEY"
"""Where vLLM's server takes the bearer key it requires on /v1 (its `--api-key` by
environment, kept off the command line); the engine emulator reads it too."""
HEALTH_PATH: Final = "/health"

MODEL_CACHE_VOLUME: Final = "model-cache"
MODEL_CACHE_DIR: Final = "/models"
SHM_VOLUME: Final = "dshm"
SHM_DIR: Final = "/dev/shm"
ENGINE_CONFIG_VOLUME: Final = "engine-config"
ENGINE_CONFIG_DIR: Final = "/etc/inferfleet/engine"
MODEL_SOURCE_VOLUME: Final = "model-source"
MODEL_SOURCE_DIR: Final = "/model-source"
DRAFT_SOURCE_VOLUME: Final = "draft-source"
DRAFT_SOURCE_DIR: Final = "/draft-source"

NON_ROOT_UID: Final = 1000
DEFAULT_HF_TOKEN_SECRET: Final = "hf-token"
DEFAULT_HF_TOKEN_KEY: Final = "token"
DEFAULT_SIM_ENGINE_IMAGE: Final = f"inferfleet/sim-engine:{__version__}"
"""`inferfleet` is a placeholder registry namespace: an install names where it pushed the image
(`inferfleet run --sim-engine-image`, the chart's `image.registry`)."""

DEFAULT_WEIGHTS_IMAGE: Final = f"inferfleet/operator:{__version__}"
"""The image whose `inferfleet weights` fills a weight cache and holds replicas until it is
filled (`inferfleet run --weights-image`, the chart's operator image)."""

DEFAULT_COLD_START_SECONDS: Final = 1200
"""Budget from container start to a healthy engine: pulling and loading a 70B checkpoint, then
compiling and capturing CUDA graphs, takes 10+ minutes on a cold node."""
STARTUP_PROBE_PERIOD_SECONDS: Final = 10

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class UnsupportedSpecError(ValueError):
    """A spec field the engine cannot honour. Refused, never dropped: the message names the
    field, the value and why, so the reconciler can put it in a condition as it is."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field_path = field_path
        self.message = message


@dataclass(frozen=True)
class EngineOptions:
    """Install-wide settings of the adapters (not part of any spec)."""

    hf_token_secret: str = DEFAULT_HF_TOKEN_SECRET
    hf_token_key: str = DEFAULT_HF_TOKEN_KEY
    cold_start_seconds: int = DEFAULT_COLD_START_SECONDS
    sim_engine_image: str = DEFAULT_SIM_ENGINE_IMAGE
    weights_image: str = DEFAULT_WEIGHTS_IMAGE
    hf_endpoint: str | None = None
    """A Hugging Face Hub mirror that downloads use (`HF_ENDPOINT`); None: the Hub."""

    def __post_init__(self) -> None:
        if self.cold_start_seconds < STARTUP_PROBE_PERIOD_SECONDS:
            raise ValueError(
                f"cold_start_seconds must be at least {STARTUP_PROBE_PERIOD_SECONDS} "
                f"(got {self.cold_start_seconds})"
            )


@dataclass(frozen=True)
class EngineContainer:
    """One engine container and what the pod around it must provide."""

    container: dict[str, Any]
    volumes: list[dict[str, Any]] = field(default_factory=list)
    config_files: dict[str, str] = field(default_factory=dict)
    """File name -> content, for a ConfigMap mounted at ENGINE_CONFIG_DIR."""
    gpus: int = 0
    metrics_path: str = "/metrics"
    run_as_user: int | None = NON_ROOT_UID
    """The user the image runs as; None: the image needs root (capabilities are still dropped)."""
    capabilities: tuple[str, ...] = ()
    """Capabilities added back after all are dropped (a multi-node group's SSH daemon)."""
    cold_start_seconds: int = DEFAULT_COLD_START_SECONDS


@dataclass(frozen=True)
class ResolvedSource:
    """A model source as the container sees it."""

    model: str
    """What the engine's model argument gets: a hub repo id or a local path."""
    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    from_hub: bool = False


def resolve_source(uri: str, *, field_path: str, volume: str, mount_dir: str) -> ResolvedSource:
    """`hf://` and `pvc://` sources as a model argument plus volumes; the rest refused."""
    scheme, _, rest = uri.partition("://")
    rest = rest.strip("/")
    source = WeightSource.of(uri)
    if source is WeightSource.NETWORK:
        if not rest:
            raise UnsupportedSpecError(field_path, f"{uri!r} names no Hugging Face repository")
        return ResolvedSource(model=rest, from_hub=True)
    if source is WeightSource.CACHE:
        claim, _, path = rest.partition("/")
        if not _DNS_SUBDOMAIN.match(claim) or len(claim) > 253:
            raise UnsupportedSpecError(
                field_path,
                f"{uri!r}: {claim!r} is not a PersistentVolumeClaim name (pvc://claim/path)",
            )
        return ResolvedSource(
            model=f"{mount_dir}/{path}" if path else mount_dir,
            volumes=(
                {
                    "name": volume,
                    "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
                },
            ),
            mounts=({"name": volume, "mountPath": mount_dir, "readOnly": True},),
        )
    raise UnsupportedSpecError(
        field_path,
        f"{uri!r}: {scheme}:// sources are not supported yet; copy the weights to a "
        "PersistentVolumeClaim and use pvc://claim/path, or use hf://org/repo",
    )


def model_source(spec: ModelDeploymentSpec) -> ResolvedSource:
    return resolve_source(
        spec.model.source,
        field_path="model.source",
        volume=MODEL_SOURCE_VOLUME,
        mount_dir=MODEL_SOURCE_DIR,
    )


def draft_source(spec: ModelDeploymentSpec) -> ResolvedSource | None:
    speculative = spec.speculative_decoding
    if speculative is None or speculative.draft_model is None:
        return None
    return resolve_source(
        speculative.draft_model,
        field_path="speculativeDecoding.draftModel",
        volume=DRAFT_SOURCE_VOLUME,
        mount_dir=DRAFT_SOURCE_DIR,
    )


ADAPTER_SOURCE_DIR: Final = "/adapters"


def adapter_sources(spec: ModelDeploymentSpec) -> list[tuple[str, ResolvedSource]]:
    """Each LoRA adapter's name and source as the container sees it (a `pvc://` one mounted
    read-only at ADAPTER_SOURCE_DIR/<its name>)."""
    return [
        (
            adapter.name,
            resolve_source(
                adapter.source,
                field_path=f"adapters[{index}].source",
                volume=f"adapter-{index}",
                mount_dir=f"{ADAPTER_SOURCE_DIR}/{adapter.name}",
            ),
        )
        for index, adapter in enumerate(spec.adapters)
    ]


def hub_env(options: EngineOptions) -> list[dict[str, Any]]:
    """What a download from the hub needs: the install's token by reference (where the
    Secret exists: gated models need it), and the install's hub mirror where it has one."""
    token = {"name": options.hf_token_secret, "key": options.hf_token_key, "optional": True}
    env: list[dict[str, Any]] = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": token}}]
    if options.hf_endpoint is not None:
        env.append({"name": "HF_ENDPOINT", "value": options.hf_endpoint})
    return env


def source_env(sources: list[ResolvedSource], options: EngineOptions) -> list[dict[str, Any]]:
    """Hub settings: the cache on the model volume and the hub's, or offline."""
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": MODEL_CACHE_DIR}]
    if any(source.from_hub for source in sources):
        env += hub_env(options)
    else:
        env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
    return env


def source_volumes(
    sources: list[ResolvedSource],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes = [v for source in sources for v in source.volumes]
    mounts = [m for source in sources for m in source.mounts]
    return volumes, mounts


SHM_GIB_PER_GPU: Final = 2
"""RAM-backed /dev/shm per GPU (`gpu_volumes`); it counts against the pod's memory."""


def gpu_volumes(gpus: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model cache (node-local, refilled on restart) and a RAM-backed /dev/shm: NCCL and
    the engines' worker processes exchange tensors through shared memory, and a container's
    default 64 MiB is far too small."""
    shm = f"{SHM_GIB_PER_GPU * gpus}Gi"
    volumes = [
        {"name": MODEL_CACHE_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
    ]
    mounts = [
        {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_DIR},
        {"name": SHM_VOLUME, "mountPath": SHM_DIR},
    ]
    return volumes, mounts


def probes(cold_start_seconds: int) -> dict[str, dict[str, Any]]:
    """Startup probe: up to the cold-start budget to become healthy (weights load, CUDA graphs
    capture), and only then do readiness and liveness apply; liveness restarts an engine that
    stops answering for a minute, readiness takes it out of the Service within 15 s."""
    health = {"path": HEALTH_PATH, "port": PORT_NAME}
    return {
        "startupProbe": {
            "httpGet": dict(health),
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(cold_start_seconds / STARTUP_PROBE_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": dict(health),
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": dict(health),
            "periodSeconds": 15,
            "timeoutSeconds": 10,
            "failureThreshold": 4,
        },
    }


def container(
    name: str,
    image: str,
    *,
    command: list[str],
    args: list[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    cold_start_seconds: int,
    extra_ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A container dict in wire form; env sorted by name, mounts by path (order carries no
    meaning for either here, and a stable order keeps server-side apply quiet)."""
    ports = [{"name": PORT_NAME, "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    ports += extra_ports or []
    result: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": command,
        "args": args,
        "ports": ports,
    }
    if env:
        result["env"] = sorted(env, key=lambda e: str(e["name"]))
    result.update(probes(cold_start_seconds))
    if mounts:
        result["volumeMounts"] = sorted(mounts, key=lambda m: str(m["mountPath"]))
    return result


def image_of(spec: ModelDeploymentSpec, repository: str, pinned_tag: str) -> str:
    """`engine.image` wins; else the repository at `engine.version` (as a tag) or the pin."""
    if spec.engine.image:
        return spec.engine.image
    return f"{repository}:{spec.engine.version or pinned_tag}"


def image_repository(reference: str) -> str:
    """An image reference without its tag or digest. The tag is what follows the last colon
    after the last slash: a registry's port is not a tag."""
    reference = reference.split("@", 1)[0]
    colon = reference.rfind(":")
    return reference[:colon] if colon > reference.rfind("/") else reference


_SIXTEEN_BIT = {
    WeightPrecision.BF16: KvCacheDtype.BF16,
    WeightPrecision.FP16: KvCacheDtype.FP16,
}


def activation_dtype(precision: PrecisionSpec) -> str | None:
    """The 16-bit dtype the engine computes (and caches KV) in, where the spec fixes it: the
    weights' own for 16-bit weights, the KV-cache dtype asked for with quantized weights."""
    kv_for_weights = _SIXTEEN_BIT.get(precision.weights)
    dtype = kv_for_weights or precision.kv_cache
    return {KvCacheDtype.BF16: "bfloat16", KvCacheDtype.FP16: "float16"}.get(dtype)


def check_gpu_engine_spec(spec: ModelDeploymentSpec) -> None:
    """Refusals shared by the GPU engines (vLLM and TensorRT-LLM)."""
    precision = spec.precision
    kv_for_weights = _SIXTEEN_BIT.get(precision.weights)
    if (
        kv_for_weights is not None
        and precision.kv_cache in _SIXTEEN_BIT.values()
        and precision.kv_cache != kv_for_weights
    ):
        # Both engines keep a 16-bit KV cache in the activation dtype, which is the dtype of
        # 16-bit weights; fp8 is the only KV dtype that differs from it.
        raise UnsupportedSpecError(
            "precision.kvCache",
            f"{precision.kv_cache.value} KV cache with {precision.weights.value} weights: the "
            "engines keep a 16-bit KV cache in the weights' dtype; use auto, "
            f"{kv_for_weights.value} or fp8",
        )
    speculative = spec.speculative_decoding
    if (
        speculative is not None
        and speculative.method == SpeculativeMethod.MTP
        and spec.model.architecture is None
        and spec.model.architecture_from is None
        and spec.model.name in catalog_models()
        and catalog_models()[spec.model.name].prediction_layers == 0
    ):
        raise UnsupportedSpecError(
            "speculativeDecoding.method",
            f"mtp needs a checkpoint with multi-token-prediction layers (DeepSeek-V3 family); "
            f"{spec.model.name} has none: use eagle3, draft-model or ngram",
        )
