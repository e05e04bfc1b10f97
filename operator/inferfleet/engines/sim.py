"""The CPU engine emulator (`inferfleet sim-engine`): vLLM's API and metrics, timed by the
planner's roofline model of the GPU the spec names (see `inferfleet.sim`).

Image: `engine.image`; else the install's (`EngineOptions.sim_engine_image`, by default
`inferfleet/sim-engine:<inferfleet version>`), at `engine.version` if the spec gives one. Command
`inferfleet sim-engine` with these options, all always given except those in brackets:

    --model-name NAME            the served model name (requests must use it)
    --model NAME                 catalog model whose shape drives the timing
    [--architecture JSON]        the shape in full (ModelArchitecture wire form), when the
                                 spec gives one instead of a catalog name
    --gpu TYPE                   GPU type emulated, e.g. H100-80GB
    --tensor N, --pipeline N     parallelism
    --weights P                  bf16, fp16, fp8, int8, int4, fp4
    [--method M]                 awq, gptq, smoothquant, fp8, nvfp4, mxfp4 (quantized only)
    --kv-cache D                 auto, bf16, fp16, fp8
    --max-sequences N, --max-batched-tokens N, --max-model-length N
    [--adapter NAME=RANK]        a LoRA adapter served by its name (one per adapter)
    --memory-utilization F
    --chunked-prefill | --no-chunked-prefill
    --prefix-caching | --no-prefix-caching
    --role R                     aggregated, prefill, decode
    --port 8000
    then engine.extraArgs, verbatim.

What the emulator does not model, by design: weights (it loads none, so `model.source` and
the draft model are not read and no volume is mounted) and speculative decoding (timings are
those of plain decoding). It needs no GPU: the renderer requests none, but still selects the
GPU type's nodes so that scheduling is exercised on the dev cluster's fake GPU nodes.
"""

from __future__ import annotations

import json
from typing import Final

from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.engines.common import (
    ENGINE_PORT,
    NON_ROOT_UID,
    EngineContainer,
    EngineOptions,
    container,
    image_of,
    image_repository,
)

COMMAND: Final = ("inferfleet", "sim-engine")


def _image(spec: ModelDeploymentSpec, install_default: str) -> str:
    if spec.engine.image or spec.engine.version:
        return image_of(spec, image_repository(install_default), "")
    return install_default


def _on_off(flag: str, on: bool) -> str:
    return f"--{flag}" if on else f"--no-{flag}"


def build(
    spec: ModelDeploymentSpec, role: Role, *, model_name: str, options: EngineOptions
) -> EngineContainer:
    precision, batching, parallelism = spec.precision, spec.batching, spec.parallelism
    args = ["--model-name", model_name, "--model", spec.model.name]
    if spec.model.architecture is not None:
        args += [
            "--architecture",
            json.dumps(spec.model.architecture.to_wire(), sort_keys=True, separators=(",", ":")),
        ]
    args += [
        "--gpu", spec.gpu.type.value,
        "--tensor", str(parallelism.tensor),
        "--pipeline", str(parallelism.pipeline),
        "--weights", precision.weights.value,
    ]  # fmt: skip
    if precision.method is not None:
        args += ["--method", precision.method.value]
    args += [
        "--kv-cache", precision.kv_cache.value,
        "--max-sequences", str(batching.max_sequences),
        "--max-batched-tokens", str(batching.max_batched_tokens),
        "--max-model-length", str(spec.max_model_length()),
        "--memory-utilization", str(spec.gpu.memory_utilization),
        _on_off("chunked-prefill", batching.chunked_prefill),
        _on_off("prefix-caching", spec.prefix_caching),
        "--role", role.value,
        "--port", str(ENGINE_PORT),
        "--drain-timeout", str(spec.drain_seconds()),
    ]  # fmt: skip
    for adapter in spec.adapters:
        args += ["--adapter", f"{adapter.name}={adapter.rank}"]
    args += list(spec.engine.extra_args)
    return EngineContainer(
        container=container(
            "engine",
            _image(spec, options.sim_engine_image),
            command=list(COMMAND),
            args=args,
            env=[],
            mounts=[],
            cold_start_seconds=options.cold_start_seconds,
        ),
        gpus=0,
        metrics_path="/metrics",
        run_as_user=NON_ROOT_UID,
        cold_start_seconds=options.cold_start_seconds,
    )
