"""vLLM (pinned 0.33.0, image `vllm/vllm-openai:v0.33.0`): `vllm serve MODEL [flags]`.

Every flag below was checked in the source of the pinned release (the vllm 0.33.0 wheel from
PyPI): flags are generated from the config dataclasses in `vllm/config/*.py`, and booleans
become `--x/--no-x` through `argparse.BooleanOptionalAction`:

spec field                      flag                                            source
------------------------------  ----------------------------------------------  -----------
model.source                    positional MODEL (`vllm serve MODEL`)           [cli]
(served name)                   --served-model-name                             [model]
-                               --host 0.0.0.0, --port 8000                     [cli]
parallelism.tensor              --tensor-parallel-size                          [parallel]
parallelism.pipeline            --pipeline-parallel-size                        [parallel]
parallelism.expertParallel      --enable-expert-parallel                        [parallel]
precision.weights (16-bit)      --dtype bfloat16 | float16                      [model]
precision.weights fp8 + fp8     --quantization fp8                              [model]
precision.kvCache               --kv-cache-dtype auto | fp8                     [cache]
batching.maxSequences           --max-num-seqs                                  [scheduler]
batching.maxBatchedTokens       --max-num-batched-tokens                        [scheduler]
batching.chunkedPrefill         --enable-chunked-prefill | --no-...             [scheduler]
batching.maxModelLength         --max-model-len                                 [model]
prefixCaching                   --enable-prefix-caching | --no-...              [cache]
gpu.memoryUtilization           --gpu-memory-utilization                        [cache]
rollout.drainSeconds            --shutdown-timeout (int s; its default, 0,     [engine]
                                aborts every in-flight request on SIGTERM)
adapters                        --enable-lora, --max-loras (all of them),      [lora]
                                --max-lora-rank (rounded up to a rank vLLM
                                takes), --lora-modules NAME=SOURCE ...
speculativeDecoding             --speculative-config '{"method", "model",      [speculative]
                                "num_speculative_tokens"}'
topology prefill/decode         --kv-transfer-config '{"kv_connector":          [kv_transfer]
                                "NixlConnector", "kv_role": "kv_both"}'

[cli] `vllm serve [model_tag] [options]` (vllm/entrypoints/cli/serve.py); --host and --port
  from `FrontendArgs` (vllm/entrypoints/common/cli_args.py);
[model], [parallel], [cache], [scheduler]: the ModelConfig, ParallelConfig, CacheConfig and
  SchedulerConfig groups of `EngineArgs.add_cli_args` (vllm/engine/arg_utils.py; choices in
  vllm/config/model.py `ModelDType`, cache.py `CacheDType`);
[lora] vllm/config/lora.py `LoRAConfig` (max_loras, max_lora_rank and its allowed values) and
  `--lora-modules` (vllm/entrypoints/openai/cli_args.py, `name=path` entries);
[speculative] vllm/config/speculative.py `SpeculativeMethod` (ngram, draft_model, eagle,
  eagle3, mtp); [engine] `EngineArgs.add_cli_args` (vllm/engine/arg_utils.py) into
  `VllmConfig.shutdown_timeout` (vllm/config/vllm.py: running requests may complete for up to
  that long, the rest are aborted); [kv_transfer] vllm/config/kv_transfer.py
  `KVTransferConfig` (kv_role) and NixlConnector in
  vllm/distributed/kv_transfer/kv_connector/factory.py.
Endpoints: GET /health (vllm/entrypoints/serve/instrumentator/health.py), Prometheus text at
/metrics (.../instrumentator/metrics.py).

Quantization: vLLM reads the scheme from the checkpoint's `config.json`
(`quantization_config.quant_method`) and picks its fastest kernel for it (AWQ/GPTQ through
Marlin). An explicit `--quantization` that disagrees with the checkpoint is a startup error
(`ModelConfig._verify_quantization`, vllm/config/model.py),
and current AWQ, GPTQ and INT8 (SmoothQuant) checkpoints declare `compressed-tensors`, so
awq, gptq and smoothquant pass no flag: the checkpoint must hold those weights. `fp8` weights
with `method: fp8` pass `--quantization fp8`: vLLM quantizes a 16-bit checkpoint when loading
it, and loads `fp8` and ModelOpt FP8 checkpoints too (it switches to `modelopt` by itself,
`override_quantization_method`); `fp8` weights without a method pass nothing, which also
suits compressed-tensors FP8 checkpoints (those conflict with an explicit `fp8`).

KV cache: "an explicit float16 or bfloat16 must match the model data type" (CacheConfig), so
a bf16/fp16 `kvCache` sets the activation dtype (`--dtype`) and keeps `--kv-cache-dtype auto`;
one that disagrees with 16-bit weights is refused.

Disaggregated prefill/decode: both roles run NixlConnector with `kv_role: kv_both`; which
role an engine plays comes from the request's `kv_transfer_params`, set by the router. The
NIXL side channel (decode engines pull KV from a prefill engine through it) listens on the pod
IP, port 5600 (`VLLM_NIXL_SIDE_CHANNEL_HOST`/`_PORT`, vllm/envs.py).

The image runs as any user; HOME points at /tmp so vLLM's and Triton's caches are writable, and
usage reporting is off (`VLLM_NO_USAGE_STATS`): a fleet's engines should not phone home.
"""

from __future__ import annotations

import json
from typing import Any, Final

from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    PrecisionSpec,
    QuantizationMethod,
    Role,
    SpeculativeMethod,
    WeightPrecision,
)
from inferfleet.api.model_spec import lora_slot_rank
from inferfleet.engines.common import (
    ENGINE_PORT,
    NON_ROOT_UID,
    EngineContainer,
    EngineOptions,
    ResolvedSource,
    activation_dtype,
    adapter_sources,
    check_gpu_engine_spec,
    container,
    draft_source,
    gpu_volumes,
    image_of,
    model_source,
    source_env,
    source_volumes,
)

PINNED_VERSION: Final = "0.33.0"
IMAGE_REPOSITORY: Final = "vllm/vllm-openai"
NIXL_SIDE_CHANNEL_PORT: Final = 5600

_SPECULATIVE_METHODS: Final = {
    SpeculativeMethod.NGRAM: "ngram",
    SpeculativeMethod.EAGLE: "eagle",
    SpeculativeMethod.EAGLE3: "eagle3",
    SpeculativeMethod.DRAFT_MODEL: "draft_model",
    SpeculativeMethod.MTP: "mtp",
}


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _on_off(flag: str, on: bool) -> str:
    return f"--{flag}" if on else f"--no-{flag}"


def speculative_config(spec: ModelDeploymentSpec, draft: ResolvedSource | None) -> str | None:
    speculative = spec.speculative_decoding
    if speculative is None:
        return None
    config: dict[str, Any] = {
        "method": _SPECULATIVE_METHODS[speculative.method],
        "num_speculative_tokens": speculative.num_tokens,
    }
    if draft is not None:
        config["model"] = draft.model
    return _json(config)


def _precision_args(precision: PrecisionSpec) -> list[str]:
    """The dtype where the spec fixes it, online FP8 quantization, the KV-cache dtype; other
    quantized checkpoints are read as such (vLLM takes the scheme from their config)."""
    args = []
    dtype = activation_dtype(precision)
    if dtype is not None:
        args += ["--dtype", dtype]
    if precision.weights == WeightPrecision.FP8 and precision.method == QuantizationMethod.FP8:
        args += ["--quantization", "fp8"]
    kv_dtype = "fp8" if precision.kv_cache == KvCacheDtype.FP8 else "auto"
    return [*args, "--kv-cache-dtype", kv_dtype]


def _lora_args(spec: ModelDeploymentSpec, adapters: list[tuple[str, ResolvedSource]]) -> list[str]:
    """Every adapter resident on every replica, all of them allowed in one batch."""
    if not adapters:
        return []
    return [
        "--enable-lora",
        "--max-loras", str(len(adapters)),
        "--max-lora-rank", str(lora_slot_rank(spec.adapters)),
        "--lora-modules", *(f"{name}={source.model}" for name, source in adapters),
    ]  # fmt: skip


def build(
    spec: ModelDeploymentSpec, role: Role, *, model_name: str, options: EngineOptions
) -> EngineContainer:
    check_gpu_engine_spec(spec)
    source = model_source(spec)
    draft = draft_source(spec)
    adapters = adapter_sources(spec)
    sources = [source] + ([draft] if draft else []) + [a for _, a in adapters]
    precision, batching = spec.precision, spec.batching
    gpus = spec.parallelism.gpus_per_replica

    args = [
        source.model,
        "--served-model-name", model_name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--tensor-parallel-size", str(spec.parallelism.tensor),
        "--pipeline-parallel-size", str(spec.parallelism.pipeline),
    ]  # fmt: skip
    if spec.parallelism.expert_parallel:
        # The MoE layers' experts are spread over the tensor-parallel GPUs.
        args.append("--enable-expert-parallel")
    args += _precision_args(precision)
    args += [
        "--max-num-seqs", str(batching.max_sequences),
        "--max-num-batched-tokens", str(batching.max_batched_tokens),
        "--max-model-len", str(spec.max_model_length()),
        _on_off("enable-chunked-prefill", batching.chunked_prefill),
        _on_off("enable-prefix-caching", spec.prefix_caching),
        "--gpu-memory-utilization", str(spec.gpu.memory_utilization),
        # On SIGTERM, in-flight requests finish within this (its default, 0, aborts them).
        "--shutdown-timeout", str(spec.drain_seconds()),
    ]  # fmt: skip
    speculative = speculative_config(spec, draft)
    if speculative is not None:
        args += ["--speculative-config", speculative]
    args += _lora_args(spec, adapters)

    env = source_env(sources, options)
    env += [
        {"name": "HOME", "value": "/tmp"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]
    extra_ports = []
    if role in (Role.PREFILL, Role.DECODE):
        args += [
            "--kv-transfer-config",
            _json({"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
        ]
        env += [
            {
                "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        ]
        extra_ports.append(
            {"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}
        )
    args += list(spec.engine.extra_args)

    volumes, mounts = gpu_volumes(gpus)
    more_volumes, more_mounts = source_volumes(sources)
    return EngineContainer(
        container=container(
            "engine",
            image_of(spec, IMAGE_REPOSITORY, f"v{PINNED_VERSION}"),
            command=["vllm", "serve"],
            args=args,
            env=env,
            mounts=mounts + more_mounts,
            cold_start_seconds=options.cold_start_seconds,
            extra_ports=extra_ports,
        ),
        volumes=volumes + more_volumes,
        gpus=gpus,
        metrics_path="/metrics",
        run_as_user=NON_ROOT_UID,
        cold_start_seconds=options.cold_start_seconds,
    )
