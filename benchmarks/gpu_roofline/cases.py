"""The cases to measure (`plan`) and the planner beside what was measured (`compare`); the
project's planner and catalog, no GPU. `measure.py` times the cases on a GPU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from inferfleet.api.catalog import GpuCatalog, GpuType, catalog_models
from inferfleet.api.model_deployment import KvCacheDtype, QuantizationMethod, WeightPrecision
from inferfleet.planning.calibration import PUBLISHED_POINTS
from inferfleet.planning.memory import kv_bytes_per_token, plan_memory
from inferfleet.planning.performance import (
    StepLoad,
    linear_work,
    max_throughput,
    step_time,
    utilisation,
)
from inferfleet.planning.replica import ReplicaConfig

# Decode batches (sequences, context) and prefill chunks swept for every model and precision.
_DECODE_SWEEP = ((1, 1024), (32, 1024), (128, 2048), (256, 4096))
_PREFILL_SWEEP = (512, 2048, 8192)
# Models and weight precisions measured; each must fit one GPU of the type measured.
_MEASURED = (("llama-3.1-8b", "bf16"), ("llama-3.1-8b", "fp8"), ("llama-3.3-70b", "fp8"))


def _case(
    model: str,
    weights: str,
    label: str,
    *,
    decode: tuple[int, int] = (0, 0),
    prefill: tuple[int, int, int] = (0, 0, 0),
) -> dict[str, Any]:
    sequences, context = decode
    prompts, chunk, start = prefill
    return {
        "model": model,
        "weights": weights,
        "label": label,
        "decode_sequences": sequences,
        "decode_context": context,
        "prefill_prompts": prompts,
        "prefill_chunk": chunk,
        "prefill_start": start,
    }


def _steady_state_prefill(
    batch: int, input_tokens: int, output_tokens: int
) -> tuple[int, int, int]:
    """The prompt work of a max-throughput step (`performance.max_throughput`): batch x input /
    output prompt tokens whose queries each attend to input / 2 positions on average."""
    tokens = max(1, round(batch * input_tokens / output_tokens))
    # Equal chunks of whole or partial prompts, each placed so that its queries' mean causal
    # span is input / 2: the planner's tokens and attention pairs both.
    prompts = math.ceil(tokens / input_tokens)
    chunk = round(tokens / prompts)
    return prompts, chunk, max(0, (input_tokens - chunk) // 2)


def _fits(model: str, weights: str, gpu_type: GpuType) -> bool:
    """Whether the weights leave a quarter of one GPU for the caches the cases allocate."""
    config = _config(model, weights, gpu_type)
    return plan_memory(config).weights <= 0.75 * config.gpu.memory_bytes


def _config(model: str, weights: str, gpu_type: GpuType) -> ReplicaConfig:
    """One GPU as measured: `weights` (bf16 or FP8 per tensor) and a bf16 KV cache."""
    fp8 = weights == "fp8"
    return ReplicaConfig(
        model=catalog_models()[model],
        gpu_type=gpu_type,
        gpu=GpuCatalog.builtin()[gpu_type],
        weights=WeightPrecision.FP8 if fp8 else WeightPrecision.BF16,
        method=QuantizationMethod.FP8 if fp8 else None,
        kv_cache=KvCacheDtype.BF16,
    )


def plan(gpu_name: str) -> dict[str, Any]:
    gpu_type = GpuType(gpu_name)
    models = catalog_models()
    cases: list[dict[str, Any]] = []
    for model, weights in _MEASURED:
        if not _fits(model, weights, gpu_type):
            continue
        for chunk in _PREFILL_SWEEP:
            cases.append(_case(model, weights, f"prefill {chunk}", prefill=(1, chunk, 0)))
        for sequences, context in _DECODE_SWEEP:
            label = f"decode {sequences} x {context}"
            cases.append(_case(model, weights, label, decode=(sequences, context)))
        if weights != "fp8":
            continue
        for point in PUBLISHED_POINTS:
            if point.model != model or point.gpu_type is not gpu_type or not point.fp8:
                continue
            one_gpu = point.tensor == 1
            if point.concurrency is not None or point.reference_gpu is not None or not one_gpu:
                continue
            config = point.config(GpuCatalog.builtin())
            capacity = plan_memory(config).kv_capacity_tokens
            batch = max_throughput(config, point.input_tokens, point.output_tokens, capacity).batch
            label = f"max throughput {point.input_tokens}/{point.output_tokens} (batch {batch})"
            cases.append(
                _case(
                    model,
                    weights,
                    label,
                    decode=(batch, point.input_tokens + point.output_tokens // 2),
                    prefill=_steady_state_prefill(batch, point.input_tokens, point.output_tokens),
                )
            )
    shapes = {
        name: {
            "layers": m.layers,
            "hidden": m.hidden_size,
            "heads": m.attention_heads,
            "kv_heads": m.kv_heads,
            "head_dim": m.head_dim,
            "intermediate": m.intermediate_size,
            "vocab": m.vocab_size,
        }
        for name, m in models.items()
        if any(name == model for model, _ in _MEASURED)
    }
    return {"gpu": gpu_type.value, "models": shapes, "cases": cases}


_DEVICE_TYPES = {"NVIDIA H200": GpuType.H200_141GB, "NVIDIA H100 80GB HBM3": GpuType.H100_80GB}


_HEADER = """# Engine steps on H100 and H200 against the planner

Generated by `python -m benchmarks.gpu_roofline compare benchmarks/results/gpu_roofline_h100.json
benchmarks/results/gpu_roofline_h200.json` from the measurements beside this file (`measure`
on one GPU of each type). Each row is one engine step of a Llama decoder stack with
the model's shapes and random weights, captured as a CUDA graph and replayed (median), so no
host time is in it; "GEMMs" and "attention" are the same step's linear layers and attention
timed alone. The planner's columns are `planning.performance.step_time` for the same work
(bf16 KV cache, as measured), without its per-step host overhead. "planner / GPU step" below 1
means the planner expects the step to be faster than these kernels ran it. GEMM MFU and MBU
are the step's linear FLOPs and weight bytes over the GEMMs' time, against the datasheet
peaks. `docs/calibration.md` says what the figures mean for the planner.
"""


def compare(measurements: Sequence[dict[str, Any]]) -> str:
    """The planner beside each measurement, one section per GPU, as Markdown."""
    return "\n".join([_HEADER, *(_compare_one(results) for results in measurements)])


def _compare_one(results: dict[str, Any]) -> str:
    gpu_type = _DEVICE_TYPES[results["device"]]
    gpu = GpuCatalog.builtin()[gpu_type]
    ceilings = results["ceilings"]
    read = max(
        kv_bytes_per_token(_config(case["model"], case["weights"], gpu_type))
        * case["decode_sequences"]
        * case["decode_context"]
        / case["decode_attention_sdpa_s"]
        for case in results["cases"]
        if "decode_attention_sdpa_s" in case
    )
    lines = [
        f"## {results['device']}",
        "",
        f"PyTorch {results['torch']}, CUDA {results['cuda']}; the planner's terms for "
        f"{gpu_type.value}. Ceilings measured on this GPU: bf16 GEMM "
        f"{ceilings['bf16_gemm_flops'] / 1e12:.0f} TFLOP/s "
        f"({ceilings['bf16_gemm_flops'] / gpu.bf16_flops:.0%} of the datasheet's), FP8 GEMM "
        f"{ceilings['fp8_gemm_flops'] / 1e12:.0f} TFLOP/s "
        f"({ceilings['fp8_gemm_flops'] / (gpu.fp8_flops or gpu.bf16_flops):.0%}); the "
        f"fastest decode attention read its KV cache at {read / 1e12:.2f} TB/s "
        f"({read / gpu.memory_bandwidth:.0%} of the datasheet's bandwidth). "
        + _prefix_kernels(results),
        "",
        "| model | weights | step | GPU step ms | GEMMs ms | attention ms | planner linear ms"
        " | planner attention ms | planner / GPU step | GEMM MFU | GEMM MBU |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in results["cases"]:
        head = f"| {case['model']} | {case['weights']} | {case['label']} |"
        if "error" in case:
            lines.append(f"{head} failed: {case['error']} |||||||")
            continue
        config = _config(case["model"], case["weights"], gpu_type)
        load = measured_load(case)
        predicted = step_time(config, load)
        flops, weight_bytes = linear_work(config, load)
        planner_s = predicted.linear_s + predicted.attention_s
        mfu = utilisation(flops, case["gemm_s"], config.linear_flops_rate)
        mbu = utilisation(weight_bytes, case["gemm_s"], gpu.memory_bandwidth)
        lines.append(
            f"{head} {case['step_s'] * 1e3:.2f} | {case['gemm_s'] * 1e3:.2f} | "
            f"{case['attention_s'] * 1e3:.2f} | {predicted.linear_s * 1e3:.2f} | "
            f"{predicted.attention_s * 1e3:.2f} | {planner_s / case['step_s']:.2f} | "
            f"{mfu:.0%} | {mbu:.0%} |"
        )
    return "\n".join(lines) + "\n"


def _prefix_kernels(results: dict[str, Any]) -> str:
    """How prompt chunks after a prefix were attended, as the measurement records it."""
    if any("prefill_attention_join_s" in case for case in results["cases"]):
        return (
            "Prompt chunks after a prefix: the faster, per step, of SDPA with a causal mask and "
            "FlashAttention in two parts joined by their log-sum-exps."
        )
    if "prefix_attention" in results:
        return f"Prompt chunks after a prefix: {results['prefix_attention']}."
    return "Prompt chunks after a prefix: SDPA with a causal mask."


def measured_load(case: dict[str, Any]) -> StepLoad:
    """The planner's view of a measured step: decodes at one context, prompt chunks whose
    queries attend causally from `prefill_start`."""
    prompts, chunk, start = case["prefill_prompts"], case["prefill_chunk"], case["prefill_start"]
    return StepLoad(
        decode_sequences=case["decode_sequences"],
        decode_context_tokens=case["decode_sequences"] * case["decode_context"],
        prefill_tokens=prompts * chunk,
        prefill_attention_pairs=prompts * chunk * (start + chunk / 2),
    )
