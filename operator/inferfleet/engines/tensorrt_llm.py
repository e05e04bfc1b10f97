"""TensorRT-LLM (pinned 1.2.1, image `nvcr.io/nvidia/tensorrt-llm/release:1.2.1`):
`trtllm-serve MODEL --backend pytorch [flags] --extra_llm_api_options FILE`.

The PyTorch backend loads Hugging Face checkpoints directly (no engine build step). Flags and keys
were checked in NVIDIA/TensorRT-LLM's repository source and docs (PyPI carries only a stub
for 1.2.1 that fetches the wheel from NVIDIA's index, so the wheel itself could not be read);
settings without a flag go in the YAML file that `--extra_llm_api_options` names, whose keys
are `LlmArgs` fields:

spec field                  setting                                             source
--------------------------  --------------------------------------------------  ----------
model.source                positional MODEL                                    [serve]
-                           --host 0.0.0.0, --port 8000, --backend pytorch      [serve]
parallelism.tensor          --tp_size                                           [serve]
parallelism.pipeline        --pp_size                                           [serve]
parallelism.expertParallel  --ep_size (the tensor size: experts spread over     [serve]
                            the tensor-parallel GPUs)
batching.maxSequences       --max_batch_size                                    [serve]
batching.maxBatchedTokens   --max_num_tokens                                    [serve]
batching.maxModelLength     --max_seq_len                                       [serve]
batching.chunkedPrefill     --enable_chunked_prefill (a flag, off by default)   [serve]
gpu.memoryUtilization       --kv_cache_free_gpu_memory_fraction                 [serve]
                            and kv_cache_config.free_gpu_memory_fraction        [kv]
precision.kvCache           kv_cache_config.dtype: auto | fp8                   [kv] [quant]
prefixCaching               kv_cache_config.enable_block_reuse                  [kv]
precision.weights (16-bit)  dtype: bfloat16 | float16                           [llm_args]
speculativeDecoding         speculative_config: decoding_type (Eagle3, NGram,   [spec]
                            DraftTarget, MTP), max_draft_len,
                            speculative_model_dir, num_nextn_predict_layers
topology prefill/decode     cache_transceiver_config: backend UCX,              [disagg]
                            max_tokens_in_buffer; prefill also
                            disable_overlap_scheduler: true

[serve] tensorrt_llm/commands/serve.py (click options of `serve`; `--extra_llm_api_options` is
  an alias of `--config`); [kv] `KvCacheConfig` (tensorrt_llm/llmapi/llm_args.py, API
  reference); [llm_args] `LlmArgs.dtype`; [quant] docs/source/features/quantization.md;
  [spec] docs/source/features/speculative-decoding.md; [disagg]
  docs/source/features/disagg-serving.md.

Notes:
* `gpu.memoryUtilization` maps to TensorRT-LLM's KV-cache share of the memory left free
  after the weights and activations are in place (vLLM's is a share of all memory). Both
  default to 0.9. It goes in the YAML as well as on the command line because the YAML's
  `kv_cache_config` replaces the one the command line built.
* Quantized weights must come as a pre-quantized (ModelOpt) checkpoint: the PyTorch backend
  reads the checkpoint's quantization config and does not quantize at load time.
* Speculation by draft model or n-grams runs with the overlap scheduler off, as the docs'
  examples do; so does a prefill (context) server in disaggregated serving.
* KV hand-off between prefill and decode goes through UCX (in NVIDIA's containers, no extra
  install); the router speaks TensorRT-LLM's disaggregated request protocol.
* `/metrics` of trtllm-serve is JSON iteration statistics; Prometheus text is served at
  `/prometheus/metrics` (tensorrt_llm/serve/openai_server.py), which is what gets scraped.
* NVIDIA's release image declares no user but root, and its MPI launcher is only set up for
  root; it runs as root with every capability dropped and no privilege escalation.
* trtllm-serve has no served-model-name option: it answers under the checkpoint id or path.

Refused (UnsupportedSpecError), from the PyTorch backend's quantization support matrix
(docs/source/features/quantization.md) and speculative-decoding notes:
* method smoothquant (INT8 weights and activations) and INT8 weight-only GPTQ: not among its
  recipes (FP8, FP4, W4A16/W4A8 AWQ and GPTQ);
* fp8 weights on A100 (Ampere has no FP8 tensor cores);
* int4 (AWQ/GPTQ W4A16) weights on B200 (no Blackwell kernels);
* speculative method eagle: the PyTorch backend runs EAGLE-3 heads only (method eagle3).
"""

from __future__ import annotations

from typing import Any, Final

import yaml

from inferfleet.api.catalog import GpuType
from inferfleet.api.model_deployment import (
    KvCacheDtype,
    ModelDeploymentSpec,
    QuantizationMethod,
    Role,
    SpeculativeMethod,
    WeightPrecision,
)
from inferfleet.engines.common import (
    ENGINE_CONFIG_DIR,
    ENGINE_CONFIG_VOLUME,
    ENGINE_PORT,
    EngineContainer,
    EngineOptions,
    ResolvedSource,
    UnsupportedSpecError,
    activation_dtype,
    check_gpu_engine_spec,
    container,
    draft_source,
    gpu_volumes,
    image_of,
    model_source,
    source_env,
    source_volumes,
)

PINNED_VERSION: Final = "1.2.1"
IMAGE_REPOSITORY: Final = "nvcr.io/nvidia/tensorrt-llm/release"
CONFIG_FILE: Final = "extra-llm-api-options.yaml"
METRICS_PATH: Final = "/prometheus/metrics"
KV_TRANSFER_BACKEND: Final = "UCX"


class _Generation:
    AMPERE = "Ampere"
    ADA = "Ada Lovelace"
    HOPPER = "Hopper"
    BLACKWELL = "Blackwell"


GPU_GENERATION: Final = {
    GpuType.A100_80GB: _Generation.AMPERE,
    GpuType.L40S_48GB: _Generation.ADA,
    GpuType.L4_24GB: _Generation.ADA,
    GpuType.H100_80GB: _Generation.HOPPER,
    GpuType.H200_141GB: _Generation.HOPPER,
    GpuType.B200_180GB: _Generation.BLACKWELL,
}

_DECODING_TYPES: Final = {
    SpeculativeMethod.NGRAM: "NGram",
    SpeculativeMethod.EAGLE3: "Eagle3",
    SpeculativeMethod.DRAFT_MODEL: "DraftTarget",
    SpeculativeMethod.MTP: "MTP",
}


def check(spec: ModelDeploymentSpec) -> None:
    """What the PyTorch backend of TensorRT-LLM 1.2 cannot run; see the module docstring."""
    check_gpu_engine_spec(spec)
    precision = spec.precision
    generation = GPU_GENERATION[spec.gpu.type]
    if precision.method == QuantizationMethod.SMOOTHQUANT:
        raise UnsupportedSpecError(
            "precision.method",
            "smoothquant (INT8 weights and activations) is not a quantization TensorRT-LLM's "
            "PyTorch backend runs; use fp8, or int4 with awq or gptq",
        )
    if precision.weights == WeightPrecision.INT8:
        raise UnsupportedSpecError(
            "precision.weights",
            f"int8 weights ({precision.method.value if precision.method else 'no method'}) are "
            "not supported by TensorRT-LLM's PyTorch backend, which runs 4-bit GPTQ/AWQ, FP8 "
            "and FP4; use vllm for INT8",
        )
    if precision.weights == WeightPrecision.FP8 and generation == _Generation.AMPERE:
        raise UnsupportedSpecError(
            "precision.weights",
            f"fp8 weights on {spec.gpu.type.value}: Ampere GPUs have no FP8 tensor cores and "
            "TensorRT-LLM has no FP8 kernels for them; use bf16 or int4, or vllm",
        )
    if precision.weights == WeightPrecision.INT4 and generation == _Generation.BLACKWELL:
        raise UnsupportedSpecError(
            "precision.weights",
            f"int4 ({precision.method.value if precision.method else 'awq/gptq'}) weights on "
            f"{spec.gpu.type.value}: TensorRT-LLM has no W4A16 kernels for Blackwell; use fp8",
        )
    speculative = spec.speculative_decoding
    if speculative is not None and speculative.method == SpeculativeMethod.EAGLE:
        raise UnsupportedSpecError(
            "speculativeDecoding.method",
            "eagle (EAGLE-1/2 heads) is not supported by TensorRT-LLM's PyTorch backend, "
            "which runs EAGLE-3 heads only; use eagle3 with an EAGLE-3 draft",
        )


def llm_api_options(
    spec: ModelDeploymentSpec, role: Role, draft: ResolvedSource | None
) -> dict[str, Any]:
    """The `--extra_llm_api_options` YAML as a dict."""
    options: dict[str, Any] = {
        "kv_cache_config": {
            "dtype": "fp8" if spec.precision.kv_cache == KvCacheDtype.FP8 else "auto",
            "enable_block_reuse": spec.prefix_caching,
            "free_gpu_memory_fraction": spec.gpu.memory_utilization,
        }
    }
    dtype = activation_dtype(spec.precision)
    if dtype is not None:
        options["dtype"] = dtype
    disable_overlap = role == Role.PREFILL
    speculative = spec.speculative_decoding
    if speculative is not None:
        decoding: dict[str, Any] = {
            "decoding_type": _DECODING_TYPES[speculative.method],
            "max_draft_len": speculative.num_tokens,
        }
        if speculative.method == SpeculativeMethod.MTP:
            # "num_nextn_predict_layers: currently must match max_draft_len" (docs).
            decoding["num_nextn_predict_layers"] = speculative.num_tokens
        if draft is not None:
            decoding["speculative_model_dir"] = draft.model
        options["speculative_config"] = decoding
        disable_overlap |= speculative.method in (
            SpeculativeMethod.NGRAM,
            SpeculativeMethod.DRAFT_MODEL,
        )
    if disable_overlap:
        options["disable_overlap_scheduler"] = True
    if role in (Role.PREFILL, Role.DECODE):
        # The docs advise a transfer buffer of at least the longest prompt.
        options["cache_transceiver_config"] = {
            "backend": KV_TRANSFER_BACKEND,
            "max_tokens_in_buffer": spec.max_model_length(),
        }
    return options


def build(
    spec: ModelDeploymentSpec, role: Role, *, model_name: str, options: EngineOptions
) -> EngineContainer:
    del model_name  # trtllm-serve has no option to rename the served model
    check(spec)
    source = model_source(spec)
    draft = draft_source(spec)
    sources = [source] + ([draft] if draft else [])
    batching = spec.batching
    gpus = spec.parallelism.gpus_per_replica
    config_path = f"{ENGINE_CONFIG_DIR}/{CONFIG_FILE}"

    args = [
        source.model,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
        "--backend", "pytorch",
        "--tp_size", str(spec.parallelism.tensor),
        "--pp_size", str(spec.parallelism.pipeline),
        *(("--ep_size", str(spec.parallelism.tensor)) if spec.parallelism.expert_parallel else ()),
        "--max_batch_size", str(batching.max_sequences),
        "--max_num_tokens", str(batching.max_batched_tokens),
        "--max_seq_len", str(spec.max_model_length()),
        "--kv_cache_free_gpu_memory_fraction", str(spec.gpu.memory_utilization),
    ]  # fmt: skip
    if batching.chunked_prefill:
        args.append("--enable_chunked_prefill")
    args += ["--extra_llm_api_options", config_path]
    args += list(spec.engine.extra_args)

    volumes, mounts = gpu_volumes(gpus)
    more_volumes, more_mounts = source_volumes(sources)
    mounts += more_mounts
    mounts.append({"name": ENGINE_CONFIG_VOLUME, "mountPath": ENGINE_CONFIG_DIR, "readOnly": True})
    config = yaml.safe_dump(llm_api_options(spec, role, draft), sort_keys=True)
    return EngineContainer(
        container=container(
            "engine",
            image_of(spec, IMAGE_REPOSITORY, PINNED_VERSION),
            command=["trtllm-serve"],
            args=args,
            env=source_env(sources, options),
            mounts=mounts,
            cold_start_seconds=options.cold_start_seconds,
        ),
        volumes=volumes + more_volumes,
        config_files={CONFIG_FILE: config},
        gpus=gpus,
        metrics_path=METRICS_PATH,
        run_as_user=None,
        cold_start_seconds=options.cold_start_seconds,
    )
