"""Engine adapters: what each spec setting becomes, and what each engine refuses (table tests)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.engines import (
    EngineContainer,
    EngineOptions,
    UnsupportedSpecError,
    build_engine_container,
    engine_container,
    roles_of,
)
from inferfleet.engines import tensorrt_llm as trt
from tests.unit.golden.specs import aggregated_spec, disaggregated_spec, merged

ENGINES = ("vllm", "tensorrt-llm", "sim")
GPU_ENGINES = ("vllm", "tensorrt-llm")


def spec_on(engine_name: str, /, **changes: Any) -> ModelDeploymentSpec:
    return aggregated_spec(**merged(changes, {"engine": {"name": engine_name}}))


def build(spec: ModelDeploymentSpec, role: Role = Role.AGGREGATED) -> EngineContainer:
    return build_engine_container(spec, role, model_name="served")


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def trt_options(engine: EngineContainer) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(engine.config_files[trt.CONFIG_FILE])
    return loaded


@dataclass(frozen=True)
class Refusal:
    reason: str
    engine: str
    changes: dict[str, Any]
    field_path: str
    says: str
    role: Role = Role.AGGREGATED
    disaggregated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


REFUSALS = [
    Refusal(
        "TRT-LLM's PyTorch backend has no INT8 SmoothQuant recipe",
        "tensorrt-llm",
        {"precision": {"weights": "int8", "method": "smoothquant"}},
        "precision.method",
        "smoothquant",
    ),
    Refusal(
        "nor INT8 weight-only GPTQ",
        "tensorrt-llm",
        {"precision": {"weights": "int8", "method": "gptq"}},
        "precision.weights",
        "int8 weights (gptq)",
    ),
    Refusal(
        "Ampere has no FP8 tensor cores",
        "tensorrt-llm",
        {"precision": {"weights": "fp8", "method": "fp8"}, "gpu": {"type": "A100-80GB"}},
        "precision.weights",
        "fp8 weights on A100-80GB",
    ),
    Refusal(
        "no W4A16 kernels on Blackwell",
        "tensorrt-llm",
        {"precision": {"weights": "int4", "method": "awq"}, "gpu": {"type": "B200-180GB"}},
        "precision.weights",
        "int4 (awq) weights on B200-180GB",
    ),
    Refusal(
        "the PyTorch backend runs EAGLE-3 heads only",
        "tensorrt-llm",
        {"speculativeDecoding": {"method": "eagle", "draftModel": "hf://org/eagle"}},
        "speculativeDecoding.method",
        "eagle (EAGLE-1/2 heads)",
    ),
    *(
        Refusal(
            "a 16-bit KV cache is kept in the weights' dtype",
            engine,
            {"precision": {"weights": "bf16", "kvCache": "fp16"}},
            "precision.kvCache",
            "fp16 KV cache with bf16 weights",
        )
        for engine in GPU_ENGINES
    ),
    *(
        Refusal(
            "Llama 3.1 has no multi-token-prediction layers",
            engine,
            {"speculativeDecoding": {"method": "mtp"}},
            "speculativeDecoding.method",
            "llama-3.1-8b has none",
        )
        for engine in GPU_ENGINES
    ),
    *(
        Refusal(
            f"{scheme}:// sources need a copy step that is not there yet",
            engine,
            {"model": {"source": f"{scheme}://bucket/llama"}},
            "model.source",
            f"{scheme}:// sources are not supported yet",
        )
        for engine in GPU_ENGINES
        for scheme in ("s3", "oci")
    ),
    Refusal(
        "draft models come from the same kinds of source",
        "vllm",
        {"speculativeDecoding": {"method": "eagle3", "draftModel": "s3://bucket/eagle3"}},
        "speculativeDecoding.draftModel",
        "s3:// sources are not supported yet",
    ),
    Refusal(
        "a pvc:// source names a claim",
        "vllm",
        {"model": {"source": "pvc://Not_A_Claim/weights"}},
        "model.source",
        "is not a PersistentVolumeClaim name",
    ),
]


@pytest.mark.parametrize("case", REFUSALS, ids=lambda c: f"{c.engine}: {c.reason}")
def test_settings_an_engine_cannot_honour_are_refused_by_field(case: Refusal) -> None:
    spec = spec_on(case.engine, **case.changes)
    with pytest.raises(UnsupportedSpecError) as raised:
        build(spec)
    assert raised.value.field_path == case.field_path
    assert case.says in str(raised.value)
    assert str(raised.value).startswith(f"{case.field_path}: ")
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize(
    ("engine", "changes"),
    [
        ("vllm", {"precision": {"weights": "int8", "method": "smoothquant"}}),
        ("vllm", {"precision": {"weights": "fp8", "method": "fp8"}, "gpu": {"type": "A100-80GB"}}),
        ("vllm", {"speculativeDecoding": {"method": "eagle", "draftModel": "hf://org/eagle"}}),
        ("tensorrt-llm", {"precision": {"weights": "fp8", "kvCache": "fp8"}}),
        ("tensorrt-llm", {"precision": {"weights": "int4", "method": "gptq"},
                          "gpu": {"type": "L4-24GB"}}),
        ("tensorrt-llm", {"speculativeDecoding": {"method": "ngram"}}),
        # The emulator loads no weights and models no speculation: nothing to refuse there.
        ("sim", {"model": {"source": "s3://bucket/llama"},
                 "speculativeDecoding": {"method": "mtp"}}),
        ("sim", {"precision": {"weights": "bf16", "kvCache": "fp16"}}),
    ],
)  # fmt: skip
def test_settings_the_engine_supports_are_accepted(engine: str, changes: dict[str, Any]) -> None:
    build(spec_on(engine, **changes))


def test_mtp_is_accepted_for_a_model_given_in_full() -> None:
    md = aggregated_spec().model.to_wire()
    spec = spec_on(
        "vllm",
        model={"name": "my-mtp-model", "architecture": md.get("architecture") or _llama_shape()},
        speculativeDecoding={"method": "mtp", "numTokens": 1},
    )
    config = json.loads(flag_value(build(spec).container["args"], "--speculative-config"))
    assert config == {"method": "mtp", "num_speculative_tokens": 1}


@pytest.mark.parametrize("engine", ["vllm", "tensorrt-llm"])
def test_mtp_is_accepted_for_a_catalog_model_that_ships_its_layers(engine: str) -> None:
    """DeepSeek-V3 and R1 ship one multi-token-prediction layer (num_nextn_predict_layers)."""
    spec = spec_on(
        engine,
        model={"name": "deepseek-r1", "source": "hf://deepseek-ai/DeepSeek-R1"},
        gpu={"type": "H200-141GB"},
        parallelism={"tensor": 8},
        precision={"weights": "fp8", "method": "fp8", "kvCache": "auto"},
        speculativeDecoding={"method": "mtp", "numTokens": 1},
    )
    build(spec)


def _llama_shape() -> dict[str, Any]:
    return aggregated_spec().architecture().to_wire()


def test_error_names_field_value_and_reason() -> None:
    error = UnsupportedSpecError("precision.method", "smoothquant is not supported: why")
    assert str(error) == "precision.method: smoothquant is not supported: why"
    assert error.field_path == "precision.method"
    assert error.message == "smoothquant is not supported: why"


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_serves_http_8000_with_health_probes(engine: str) -> None:
    container = engine_container(spec_on(engine), Role.AGGREGATED, model_name="served")
    assert container["ports"][0] == {"name": "http", "containerPort": 8000, "protocol": "TCP"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert "resources" not in container  # the renderer requests GPUs


@pytest.mark.parametrize(("cold_start", "threshold"), [(1200, 120), (600, 60), (605, 61)])
def test_startup_probe_allows_the_cold_start(cold_start: int, threshold: int) -> None:
    engine = build_engine_container(
        spec_on("vllm"),
        Role.AGGREGATED,
        model_name="m",
        options=EngineOptions(cold_start_seconds=cold_start),
    )
    probe = engine.container["startupProbe"]
    assert probe["failureThreshold"] == threshold
    assert probe["failureThreshold"] * probe["periodSeconds"] >= cold_start
    assert engine.cold_start_seconds == cold_start


def test_cold_start_budget_must_cover_one_probe_period() -> None:
    with pytest.raises(ValueError, match="cold_start_seconds"):
        EngineOptions(cold_start_seconds=5)


@pytest.mark.parametrize("engine", ENGINES)
def test_extra_args_come_last_verbatim(engine: str) -> None:
    extra = ["--flag-a", "value with spaces", "--flag-b"]
    args = build(spec_on(engine, engine={"extraArgs": extra})).container["args"]
    assert args[-3:] == extra


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_hub_token_is_a_secret_reference_that_may_be_absent(engine: str) -> None:
    options = EngineOptions(hf_token_secret="team-hf", hf_token_key="HF_TOKEN")
    engine_ = build_engine_container(
        spec_on(engine), Role.AGGREGATED, model_name="m", options=options
    )
    env = {e["name"]: e for e in engine_.container["env"]}
    assert env["HF_HOME"] == {"name": "HF_HOME", "value": "/models"}
    assert env["HF_TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "team-hf", "key": "HF_TOKEN", "optional": True}
    }
    assert "HF_HUB_OFFLINE" not in env
    assert engine_.container["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_pvc_source_is_mounted_read_only_and_the_hub_is_off(engine: str) -> None:
    built = build(spec_on(engine, model={"source": "pvc://weights/llama/8b/"}))
    assert built.container["args"][0] == "/model-source/llama/8b"
    assert {
        "name": "model-source",
        "mountPath": "/model-source",
        "readOnly": True,
    } in built.container["volumeMounts"]
    assert {
        "name": "model-source",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    } in built.volumes
    env = {e["name"]: e.get("value") for e in built.container["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "HF_TOKEN" not in env


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_every_mounted_volume_is_provided(engine: str) -> None:
    built = build(spec_on(engine, model={"source": "pvc://weights/x"}))
    provided = {v["name"] for v in built.volumes} | (
        {"engine-config"} if built.config_files else set()
    )
    assert {m["name"] for m in built.container["volumeMounts"]} == provided


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        # (weights, method, kvCache) -> (--dtype, --quantization, --kv-cache-dtype)
        (("bf16", None, "auto"), ("bfloat16", None, "auto")),
        (("fp16", None, "fp16"), ("float16", None, "auto")),
        (("fp8", "fp8", "fp8"), (None, "fp8", "fp8")),
        (("fp8", None, "auto"), (None, None, "auto")),  # a pre-quantized FP8 checkpoint
        (("int4", "awq", "auto"), (None, None, "auto")),  # detected from the checkpoint
        (("int4", "gptq", "bf16"), ("bfloat16", None, "auto")),
        (("int8", "smoothquant", "fp8"), (None, None, "fp8")),
        (("fp4", "nvfp4", "fp8"), (None, None, "fp8")),  # detected from the checkpoint
        (("fp4", "mxfp4", "bf16"), ("bfloat16", None, "auto")),
    ],
)
def test_vllm_precision_flags(
    precision: tuple[str, str | None, str], expected: tuple[str | None, str | None, str]
) -> None:
    weights, method, kv = precision
    gpu = {"type": "B200-180GB"} if weights == "fp4" else {}
    spec = spec_on("vllm", precision={"weights": weights, "method": method, "kvCache": kv}, gpu=gpu)
    args = build(spec).container["args"]

    def value(flag: str) -> str | None:
        return flag_value(args, flag) if flag in args else None

    assert (value("--dtype"), value("--quantization"), value("--kv-cache-dtype")) == expected


def test_vllm_batching_and_memory_flags() -> None:
    spec = spec_on(
        "vllm",
        parallelism={"tensor": 4, "pipeline": 2},
        batching={"maxSequences": 64, "maxBatchedTokens": 4096, "chunkedPrefill": True},
        gpu={"memoryUtilization": 0.85},
        prefixCaching=False,
    )
    args = build(spec).container["args"]
    assert flag_value(args, "--tensor-parallel-size") == "4"
    assert flag_value(args, "--pipeline-parallel-size") == "2"
    assert flag_value(args, "--max-num-seqs") == "64"
    assert flag_value(args, "--max-num-batched-tokens") == "4096"
    assert flag_value(args, "--max-model-len") == "32768"
    assert flag_value(args, "--gpu-memory-utilization") == "0.85"
    assert "--enable-chunked-prefill" in args
    assert "--no-enable-prefix-caching" in args
    assert flag_value(args, "--served-model-name") == "served"


@pytest.mark.parametrize(
    ("method", "draft", "expected"),
    [
        ("ngram", None, {"method": "ngram", "num_speculative_tokens": 3}),
        ("eagle", "hf://a/eagle",
         {"method": "eagle", "model": "a/eagle", "num_speculative_tokens": 3}),
        ("eagle3", "pvc://heads/e3",
         {"method": "eagle3", "model": "/draft-source/e3", "num_speculative_tokens": 3}),
        ("draft-model", "hf://a/small",
         {"method": "draft_model", "model": "a/small", "num_speculative_tokens": 3}),
    ],
)  # fmt: skip
def test_vllm_speculative_config(method: str, draft: str | None, expected: dict[str, Any]) -> None:
    speculative = {"method": method, "draftModel": draft}
    args = build(spec_on("vllm", speculativeDecoding=speculative)).container["args"]
    assert json.loads(flag_value(args, "--speculative-config")) == expected


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_vllm_disaggregated_roles_use_nixl(role: Role) -> None:
    container = build(disaggregated_spec(engine={"name": "vllm"}), role).container
    config = json.loads(flag_value(container["args"], "--kv-transfer-config"))
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    env = {e["name"]: e for e in container["env"]}
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "status.podIP"}
    }
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in container["ports"]


def test_vllm_aggregated_has_no_kv_transfer() -> None:
    assert "--kv-transfer-config" not in build(spec_on("vllm")).container["args"]


def test_trt_flags_and_config_file() -> None:
    spec = spec_on(
        "tensorrt-llm",
        parallelism={"tensor": 2, "pipeline": 2},
        batching={"maxSequences": 128, "maxBatchedTokens": 4096, "chunkedPrefill": False,
                  "maxModelLength": 4096},
        prefixCaching=False,
        precision={"weights": "fp8", "method": "fp8", "kvCache": "fp8"},
        gpu={"memoryUtilization": 0.8},
    )  # fmt: skip
    built = build(spec)
    args = built.container["args"]
    assert args[:7] == [
        "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--backend", "pytorch",
    ]  # fmt: skip
    assert flag_value(args, "--tp_size") == "2"
    assert flag_value(args, "--pp_size") == "2"
    assert flag_value(args, "--max_batch_size") == "128"
    assert flag_value(args, "--max_num_tokens") == "4096"
    assert flag_value(args, "--max_seq_len") == "4096"
    assert flag_value(args, "--kv_cache_free_gpu_memory_fraction") == "0.8"
    assert "--enable_chunked_prefill" not in args
    assert flag_value(args, "--extra_llm_api_options") == (
        "/etc/inferfleet/engine/extra-llm-api-options.yaml"
    )
    assert trt_options(built) == {
        "kv_cache_config": {
            "dtype": "fp8",
            "enable_block_reuse": False,
            "free_gpu_memory_fraction": 0.8,
        }
    }
    assert (built.metrics_path, built.run_as_user) == ("/prometheus/metrics", None)


@pytest.mark.parametrize(
    ("method", "draft", "expected"),
    [
        ("ngram", None, {"decoding_type": "NGram", "max_draft_len": 3}),
        ("eagle3", "hf://a/e3",
         {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model_dir": "a/e3"}),
        ("draft-model", "pvc://d/small",
         {"decoding_type": "DraftTarget", "max_draft_len": 3,
          "speculative_model_dir": "/draft-source/small"}),
    ],
)  # fmt: skip
def test_trt_speculative_config(method: str, draft: str | None, expected: dict[str, Any]) -> None:
    built = build(
        spec_on("tensorrt-llm", speculativeDecoding={"method": method, "draftModel": draft})
    )
    options = trt_options(built)
    assert options["speculative_config"] == expected
    # Draft/target and n-gram speculation run without the overlap scheduler (docs' examples).
    assert options.get("disable_overlap_scheduler", False) == (method != "eagle3")


@pytest.mark.parametrize(("role", "overlap_off"), [(Role.PREFILL, True), (Role.DECODE, False)])
def test_trt_disaggregated_roles_exchange_kv_over_ucx(role: Role, overlap_off: bool) -> None:
    options = trt_options(build(disaggregated_spec(), role))
    assert options["cache_transceiver_config"] == {"backend": "UCX", "max_tokens_in_buffer": 16384}
    assert options.get("disable_overlap_scheduler", False) is overlap_off


@pytest.mark.parametrize(
    ("engine", "image"),
    [
        ("vllm", "vllm/vllm-openai:v0.33.0"),
        ("tensorrt-llm", "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"),
        ("sim", "inferfleet/sim-engine:0.1.0"),
    ],
)
def test_default_images_follow_the_pins(engine: str, image: str) -> None:
    assert build(spec_on(engine)).container["image"] == image
    pinned = build(spec_on(engine, engine={"version": "9.9.9"})).container["image"]
    assert pinned.endswith(":9.9.9")
    custom = build(spec_on(engine, engine={"image": "registry.local/engine@sha256:abc"}))
    assert custom.container["image"] == "registry.local/engine@sha256:abc"


@pytest.mark.parametrize("role", [Role.AGGREGATED, Role.PREFILL, Role.DECODE])
def test_sim_args_are_the_emulators_options(role: Role) -> None:
    spec = (
        spec_on("sim", precision={"weights": "int4", "method": "awq"})
        if role == Role.AGGREGATED
        else disaggregated_spec(engine={"name": "sim"})
    )
    built = build(spec, role)
    args = built.container["args"]
    options = [a for a in args if a.startswith("--")]
    assert options == [
        "--model-name", "--model", "--gpu", "--tensor", "--pipeline", "--weights",
        *(["--method"] if spec.precision.method else []),
        "--kv-cache", "--max-sequences", "--max-batched-tokens", "--max-model-length",
        "--memory-utilization", "--chunked-prefill", "--prefix-caching", "--role", "--port",
        "--drain-timeout",
    ]  # fmt: skip
    assert flag_value(args, "--role") == role.value
    assert flag_value(args, "--model") == spec.model.name
    assert built.container["command"] == ["inferfleet", "sim-engine"]
    assert (built.gpus, built.volumes, built.config_files) == (0, [], {})
    assert "volumeMounts" not in built.container


def test_roles_follow_the_topology() -> None:
    assert roles_of(aggregated_spec()) == (Role.AGGREGATED,)
    assert roles_of(disaggregated_spec()) == (Role.PREFILL, Role.DECODE)
    with pytest.raises(ValueError, match="role prefill is not one of"):
        build(aggregated_spec(), Role.PREFILL)


@pytest.mark.parametrize("engine", ENGINES)
def test_output_is_deterministic(engine: str) -> None:
    first, second = build(spec_on(engine)), build(spec_on(engine))
    assert first == second
    env_names = [e["name"] for e in first.container.get("env", [])]
    assert env_names == sorted(env_names)


@pytest.mark.parametrize(
    ("engine_fields", "image"),
    [
        ({}, "registry.example.com:5000/team/sim-engine:0.1.0"),
        ({"version": "0.2.0"}, "registry.example.com:5000/team/sim-engine:0.2.0"),
        ({"image": "other/sim@sha256:abc"}, "other/sim@sha256:abc"),
    ],
)
def test_the_install_names_the_sim_engines_image(engine_fields: dict[str, str], image: str) -> None:
    options = EngineOptions(sim_engine_image="registry.example.com:5000/team/sim-engine:0.1.0")
    spec = spec_on("sim", engine=engine_fields)
    built = build_engine_container(spec, Role.AGGREGATED, model_name="served", options=options)
    assert built.container["image"] == image


MOE = {"name": "qwen3-30b-a3b", "source": "hf://Qwen/Qwen3-30B-A3B"}


@pytest.mark.parametrize("engine", GPU_ENGINES)
def test_expert_parallelism_spreads_the_experts_over_the_tensor_parallel_gpus(engine: str) -> None:
    spread = build(spec_on(engine, model=MOE, parallelism={"tensor": 4, "expertParallel": True}))
    sliced = build(spec_on(engine, model=MOE, parallelism={"tensor": 4}))
    if engine == "vllm":
        assert "--enable-expert-parallel" in spread.container["args"]
        assert "--enable-expert-parallel" not in sliced.container["args"]
    else:
        assert flag_value(spread.container["args"], "--ep_size") == "4"
        assert "--ep_size" not in sliced.container["args"]
    assert (
        flag_value(
            spread.container["args"], "--tensor-parallel-size" if engine == "vllm" else "--tp_size"
        )
        == "4"
    )


ADAPTERS = [
    {"name": "sql-assistant", "source": "hf://org/sql-lora", "rank": 16},
    {"name": "support-triage", "source": "pvc://lora-adapters/support", "rank": 40},
]


def test_vllm_serves_every_adapter_on_every_replica() -> None:
    engine = build(spec_on("vllm", adapters=ADAPTERS))
    args = engine.container["args"]
    assert "--enable-lora" in args
    assert flag_value(args, "--max-loras") == "2"
    # Rank 40 rounds up to the next rank vLLM takes.
    assert flag_value(args, "--max-lora-rank") == "64"
    start = args.index("--lora-modules") + 1
    assert args[start : start + 2] == [
        "sql-assistant=org/sql-lora",
        "support-triage=/adapters/support-triage/support",
    ]
    mounts = {m["name"]: m for m in engine.container["volumeMounts"]}
    assert mounts["adapter-1"] == {
        "name": "adapter-1",
        "mountPath": "/adapters/support-triage",
        "readOnly": True,
    }
    claims = {v["name"]: v.get("persistentVolumeClaim") for v in engine.volumes}
    assert claims["adapter-1"] == {"claimName": "lora-adapters", "readOnly": True}
    assert "--enable-lora" not in build(spec_on("vllm")).container["args"]


def test_the_sim_engine_serves_the_adapters_by_name() -> None:
    args = build(spec_on("sim", adapters=ADAPTERS)).container["args"]
    given = [args[i + 1] for i, arg in enumerate(args) if arg == "--adapter"]
    assert given == ["sql-assistant=16", "support-triage=40"]
