"""`inferfleet plan` on the examples and on bad input, through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.cli import (
    EXIT_INVALID,
    EXIT_NO_FIT,
    GPU_CATALOG_EXAMPLE,
    GPU_CATALOG_HELP,
    app,
)
from inferfleet.engines import engine_container
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.render import GPU_PRODUCT_LABEL
from inferfleet.sim import openai_api as sim_server
from tests.unit.golden import check_golden

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


def plan_json(*args: str) -> list[dict[str, object]]:
    result = runner.invoke(app, ["plan", *args, "-o", "json"])
    assert result.exit_code in (0, EXIT_NO_FIT), result.output
    plans: list[dict[str, object]] = json.loads(result.stdout)
    return plans


def test_aggregated_example_fits_and_meets_its_slo() -> None:
    (plan,) = plan_json("-f", str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml"))
    assert plan["fits"] is True
    assert plan["meetsSlo"] is True
    assert plan["slo"] == {"ttftP95Ms": 500.0, "tpotP95Ms": 50.0}
    assert plan["workload"] == {
        "requestsPerSecond": 20.0, "inputTokens": 1000, "outputTokens": 200, "inputTokensCv": 1.0
    }  # fmt: skip
    assert plan["kvBytesPerTokenPerGpu"] == 131072


def test_disaggregated_example_plans_both_pools() -> None:
    (plan,) = plan_json("-f", str(EXAMPLES / "llama-3.3-70b-fp8-disaggregated-trtllm.yaml"))
    roles = {role["role"]: role for role in plan["roles"]}  # type: ignore[attr-defined]
    assert set(roles) == {"prefill", "decode"}
    assert plan["gpusPerReplica"] == 2
    assert plan["gpus"] == 2 * (roles["prefill"]["replicas"] + roles["decode"]["replicas"])
    assert plan["meetsSlo"] is True


def test_the_nvfp4_example_fits_one_b200_and_runs_its_gemms_at_the_fp4_rate(
    tmp_path: Path,
) -> None:
    path = EXAMPLES / "llama-3.3-70b-nvfp4-b200-vllm.yaml"
    (fp4,) = plan_json("-f", str(path))
    assert fp4["fits"] is True
    assert fp4["meetsSlo"] is True
    assert fp4["gpusPerReplica"] == 1
    # The same deployment with FP8 weights: twice the weight bytes, half the GEMM rate.
    document = path.read_text().replace("weights: fp4\n    method: nvfp4", "weights: fp8")
    fp8_path = tmp_path / "fp8.yaml"
    fp8_path.write_text(document)
    (fp8,) = plan_json("-f", str(fp8_path))
    fp4_memory, fp8_memory = fp4["memoryPerGpuGiB"], fp8["memoryPerGpuGiB"]
    assert fp4_memory["weights"] < 0.6 * fp8_memory["weights"]  # type: ignore[index]
    assert fp4["idle"]["ttftMs"] < fp8["idle"]["ttftMs"]  # type: ignore[index]


def test_the_moe_example_plans_memory_from_total_and_speed_from_active_parameters() -> None:
    path = EXAMPLES / "gpt-oss-120b-mxfp4-moe-vllm.yaml"
    (plan,) = plan_json("-f", str(path))
    assert plan["fits"] is True
    assert plan["meetsSlo"] is True
    assert plan["gpusPerReplica"] == 2
    # 116.8B parameters at 4.25 bits over two GPUs.
    weights_gib = plan["memoryPerGpuGiB"]["weights"]  # type: ignore[index]
    assert 116.8e9 * 4.25 / 8 / 2 / 2**30 < weights_gib < 32
    text = runner.invoke(app, ["plan", "-f", str(path)]).stdout
    assert "116.8B parameters (5.7B active: 4 of 128 experts a token), fp4 (mxfp4)" in text


def test_the_example_that_cannot_fit_says_why_in_numbers() -> None:
    path = EXAMPLES / "llama-3.1-405b-bf16-l40s-does-not-fit.yaml"
    result = runner.invoke(app, ["plan", "-f", str(path)])
    assert result.exit_code == EXIT_NO_FIT
    assert "does not fit: weights 756.0 GiB" in result.stdout
    assert "exceed the usable 40.5 GiB (short by 719.6 GiB)" in result.stdout


def test_command_line_load_overrides_the_service() -> None:
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    (light,) = plan_json("-f", path, "--rps", "1", "--input-tokens", "500", "--output-tokens", "50")
    (heavy,) = plan_json("-f", path, "--rps", "400")
    assert light["workload"] == {
        "requestsPerSecond": 1.0, "inputTokens": 500, "outputTokens": 50, "inputTokensCv": 1.0
    }  # fmt: skip
    assert heavy["gpus"] > light["gpus"]  # type: ignore[operator]


def test_prompt_lengths_that_spread_wider_are_planned_a_longer_ttft() -> None:
    """Varied prompts queue longer for prefill and the longest set the p95: at the example's
    20 req/s one replica holds prompts all alike and as varied as the default says (CV 1),
    and prompts twice as varied need a second."""
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    plans = {cv: plan_json("-f", path, "--input-tokens-cv", cv)[0] for cv in ("0", "1", "2")}
    (declared,) = plan_json("-f", path)
    assert declared == plans["1"]  # the InferenceService says nothing: the default

    def replica(plan: dict[str, object]) -> dict[str, Any]:
        roles = plan["roles"]
        assert isinstance(roles, list)
        assert len(roles) == 1
        role: dict[str, Any] = roles[0]
        return role

    alike, varied = replica(plans["0"]), replica(plans["1"])
    assert alike["replicas"] == varied["replicas"] == 1
    assert varied["perReplica"]["ttftP95Ms"] > 1.5 * alike["perReplica"]["ttftP95Ms"]
    assert varied["perReplica"]["tpotMs"] == pytest.approx(alike["perReplica"]["tpotMs"])
    assert replica(plans["2"])["replicas"] == 2


def test_a_spread_of_prompt_lengths_out_of_range_is_refused() -> None:
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    result = runner.invoke(app, ["plan", "-f", path, "--input-tokens-cv", "3"])
    assert result.exit_code == EXIT_INVALID
    assert "--input-tokens-cv must be between 0 and 2 (got 3.0)" in result.output


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("kind: ModelDeployment\nmetadata: {name: x}\nspec:\n  model: {name: llama-3.1-8b, "
         "source: 'hf://a/b'}\n  engine: {name: vllm}\n  gpu: {type: H100-80GB}\n"
         "  parallelism: {tensor: 3}\n",
         "spec.parallelism.tensor: parallelism.tensor must divide the model's attention heads "
         "(got 3)"),
        ("kind: ModelDeployment\nmetadata: {name: x}\nspec:\n  model: {name: gpt-17, "
         "source: 'hf://a/b'}\n  engine: {name: vllm}\n  gpu: {type: H100-80GB}\n",
         "spec.model.name: model.name is not in the built-in catalog; give model.architecture "
         "in full or model.architectureFrom (got 'gpt-17')"),
        ("kind: ModelDeployment\nmetadata: {name: x}\nspec:\n  model: {name: llama-3.1-8b, "
         "source: 'hf://a/b'}\n  engine: {name: vllm}\n  gpu: {type: H100-81GB}\n",
         "spec.gpu.type: Input should be"),
        ("kind: ModelDeployment\nmetadata: {name: x}\nspec: [1, 2]\n", "spec: required mapping"),
        ("kind: ModelDeployment\nspec: {model: [\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_invalid_specs_name_the_field_and_the_rule(
    tmp_path: Path, document: str, expected: str
) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(document)
    result = runner.invoke(app, ["plan", "-f", str(path)])
    assert result.exit_code == EXIT_INVALID
    assert expected in result.stderr


def test_a_partial_load_is_refused() -> None:
    path = str(EXAMPLES / "llama-3.1-405b-bf16-l40s-does-not-fit.yaml")
    result = runner.invoke(app, ["plan", "-f", path, "--rps", "3"])
    assert result.exit_code == EXIT_INVALID
    assert "--rps, --input-tokens and --output-tokens together" in result.stderr


def test_gpu_price_overrides_change_the_cost(tmp_path: Path) -> None:
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    prices = tmp_path / "prices.yaml"
    prices.write_text("H100-80GB: {hourlyPriceUsd: 5.0}\n")
    (default,) = plan_json("-f", path)
    (doubled,) = plan_json("-f", path, "--gpu-catalog", str(prices))
    assert doubled["costPerMillionOutputTokensUsd"] == pytest.approx(
        2 * default["costPerMillionOutputTokensUsd"]  # type: ignore[operator]
    )
    prices.write_text("H100-90GB: {hourlyPriceUsd: 5.0}\n")
    result = runner.invoke(app, ["plan", "-f", path, "--gpu-catalog", str(prices)])
    assert result.exit_code == EXIT_INVALID
    assert "unknown GPU type 'H100-90GB'" in result.stderr


def test_installed_entry_point_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inferfleet.cli", "plan", "-f",
         str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Cost per 1M output tokens: $" in result.stdout


def test_crds_command_writes_what_is_committed(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["crds", "--dir", str(tmp_path / "out"), "--chart-dir", str(tmp_path / "chart")]
    )
    assert result.exit_code == 0, result.output
    for where in ("crds", "charts/inferfleet/crds"):
        committed = sorted((ROOT / where).glob("*.yaml"))
        assert [path.name for path in committed] == sorted(
            path.name for path in (tmp_path / "out").glob("*.yaml")
        )
        for path in committed:
            assert (tmp_path / "out" / path.name).read_text() == path.read_text()
            assert (tmp_path / "chart" / path.name).read_text() == path.read_text()


def test_dev_cluster_refuses_bad_node_pools_before_building_anything(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dev-cluster", "up", "--dir", str(tmp_path), "--nodes", "A99=2"])
    assert result.exit_code == EXIT_INVALID
    assert "--nodes: unknown GPU type 'A99'" in result.stderr
    assert not any(tmp_path.iterdir())


def test_dev_cluster_status_of_a_cluster_never_started(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dev-cluster", "status", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "kube-apiserver" in result.stdout
    assert "never started" in result.stdout
    down = runner.invoke(app, ["dev-cluster", "down", "--dir", str(tmp_path)])
    assert down.exit_code == 0


@pytest.mark.parametrize(
    ("example", "role"),
    [
        ("llama-3.1-8b-aggregated-vllm.yaml", Role.AGGREGATED),
        ("llama-3.3-70b-fp8-disaggregated-trtllm.yaml", Role.PREFILL),
        ("llama-3.3-70b-fp8-disaggregated-trtllm.yaml", Role.DECODE),
    ],
)
def test_the_sim_adapter_command_line_starts_the_emulator_it_describes(
    example: str, role: Role, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the renderer puts in a sim pod is what `inferfleet sim-engine` accepts, and the
    emulator it starts has the spec's shape."""
    document = next(yaml.safe_load_all((EXAMPLES / example).read_text()))
    document["spec"]["engine"] = {"name": "sim", "extraArgs": []}
    spec = ModelDeploymentSpec.model_validate(document["spec"])
    container = engine_container(spec, role, model_name="assistant")
    started: dict[str, Any] = {}
    monkeypatch.setattr(
        sim_server, "run", lambda config, name, r, **options: started.update(
            config=config, name=name, role=r, options=options
        )
    )  # fmt: skip
    result = runner.invoke(app, [*container["command"][1:], *container["args"]])
    assert result.exit_code == 0, result.output
    assert started["config"] == ReplicaConfig.from_spec(spec, GpuCatalog.builtin())
    assert started["name"] == "assistant"
    assert started["role"] == role
    assert started["options"]["prefix_caching"] is spec.prefix_caching


def test_version_is_the_packages() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"inferfleet {version('inferfleet')}\n"


def test_the_gpu_catalog_example_in_the_help_is_a_file_that_works(tmp_path: Path) -> None:
    assert GPU_CATALOG_EXAMPLE in GPU_CATALOG_HELP
    overrides = tmp_path / "gpus.yaml"
    overrides.write_text(GPU_CATALOG_EXAMPLE + "\n")
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    (default,) = plan_json("-f", path)
    (priced,) = plan_json("-f", path, "--gpu-catalog", str(overrides))
    assert priced["costPerMillionOutputTokensUsd"] != default["costPerMillionOutputTokensUsd"]


def test_render_and_run_take_the_gpu_catalog_and_refuse_a_bad_one(tmp_path: Path) -> None:
    relabelled = tmp_path / "gpus.yaml"
    relabelled.write_text("H100-80GB: {nodeProductLabel: NVIDIA-H100-SXM5-80GB}\n")
    path = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    result = runner.invoke(app, ["render", "-f", path, "--gpu-catalog", str(relabelled)])
    assert result.exit_code == 0, result.stderr
    selectors = [
        doc["spec"]["template"]["spec"]["nodeSelector"]
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc["kind"] == "Deployment"
        and doc["metadata"]["labels"].get("app.kubernetes.io/name") != "inferfleet-router"
    ]  # fmt: skip
    assert selectors == [{GPU_PRODUCT_LABEL: "NVIDIA-H100-SXM5-80GB"}]
    typo = tmp_path / "typo.yaml"
    typo.write_text("H100-80GB: {hourlyPriceUSD: 2.1}\n")
    for command in (["render", "-f", path], ["run"]):
        refused = runner.invoke(app, [*command, "--gpu-catalog", str(typo)])
        assert refused.exit_code == EXIT_INVALID
        assert str(typo) in refused.stderr
        assert "hourlyPriceUSD" in refused.stderr


def test_render_of_a_spec_that_does_not_fit_renders_no_workload_and_exits_3() -> None:
    result = runner.invoke(
        app, ["render", "-f", str(EXAMPLES / "llama-3.1-405b-bf16-l40s-does-not-fit.yaml")]
    )
    assert result.exit_code == EXIT_NO_FIT
    assert "llama-3-1-405b-on-l40s does not fit" in result.stderr
    assert "short by" in result.stderr
    kinds = {doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc}
    assert "Deployment" not in kinds or all(
        doc["metadata"]["labels"].get("app.kubernetes.io/name") == "inferfleet-router"
        for doc in yaml.safe_load_all(result.stdout)
        if doc and doc["kind"] == "Deployment"
    )


def test_render_and_plan_name_the_kinds_they_skip(tmp_path: Path) -> None:
    example = (EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml").read_text()
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(
        example
        + "\n---\nkind: ModelDeploymnet\nmetadata: {name: typo}\nspec: {}\n"
        + "---\nkind: Secret\nmetadata: {name: hf-token}\nstringData: {token: x}\n"
    )
    for command in ("render", "plan"):
        result = runner.invoke(app, [command, "-f", str(mixed)])
        assert result.exit_code == 0, result.output
        assert "skipped ModelDeploymnet typo: not a kind inferfleet reads" in result.stderr
        assert "skipped Secret hf-token" in result.stderr


def test_dev_cluster_kubeconfig_fails_where_no_cluster_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["dev-cluster", "kubeconfig", "--dir", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "no dev cluster runs in" in result.stderr


def test_run_without_a_cluster_to_talk_to_says_so_in_one_line(tmp_path: Path) -> None:
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"}
    }
    result = subprocess.run(
        [sys.executable, "-m", "inferfleet.cli", "run", "--metrics-port", "0"],
        capture_output=True, text=True, check=False, timeout=60,
        env={**environment, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: no Kubernetes configuration")


def test_the_lora_example_reserves_its_adapter_slots_in_the_plan() -> None:
    (lora,) = plan_json("-f", str(EXAMPLES / "llama-3.1-8b-lora-vllm.yaml"))
    (base,) = plan_json("-f", str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml"))
    assert lora["fits"] is True
    added = lora["memoryPerGpuGiB"]["weights"] - base["memoryPerGpuGiB"]["weights"]  # type: ignore[index]
    # Two slots of rank 64 on Llama-3.1-8B: 2 x 168M 16-bit parameters.
    assert added == pytest.approx(2 * 167_772_160 * 2 / 2**30, rel=1e-6)


@pytest.mark.parametrize(
    "example",
    sorted(path.stem for path in EXAMPLES.glob("*.yaml")),
)
def test_every_examples_plan_is_golden(example: str) -> None:
    """`plan -o json` of each example, committed: a change to the planner shows in review as
    the plans it moves."""
    check_golden(f"plan/{example}.yaml", plan_json("-f", str(EXAMPLES / f"{example}.yaml")))


def test_a_config_json_becomes_the_architecture_block_of_a_spec(tmp_path: Path) -> None:
    """A model the catalog does not know (Qwen3-8B's config.json): its architecture, printed
    ready to paste, makes a spec that validates and plans."""
    config = {
        "model_type": "qwen3", "hidden_size": 4096, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = runner.invoke(app, ["architecture", str(path)])
    assert result.exit_code == 0, result.output
    block = yaml.safe_load(result.stdout)
    assert block["architecture"]["parameterCount"] == 8_190_735_360  # Qwen3-8B: 8.2B
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "qwen3-8b", "source": "hf://Qwen/Qwen3-8B"} | block,
            "engine": {"name": "vllm"},
            "gpu": {"type": "H100-80GB"},
        }
    )
    assert spec.architecture().parameter_count == 8_190_735_360
    path.write_text(json.dumps({"model_type": "deepseek_v2"}))
    refused = runner.invoke(app, ["architecture", str(path)])
    assert refused.exit_code == EXIT_INVALID
    assert "deepseek_v2" in refused.output


def test_plan_recommend_ranks_configurations_and_places_the_given_one() -> None:
    example = str(EXAMPLES / "llama-3.3-70b-fp8-disaggregated-trtllm.yaml")
    result = runner.invoke(app, ["plan", "-f", example, "--recommend", "--top", "3"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "the cheapest configurations that meet p95 TTFT 1500 ms and p95 TPOT 60 ms" in text
    assert "\n  1  " in text
    assert "\n  4  " not in text
    assert "This ModelDeployment: #" in text
    assert "Best without a quality trade-off: #" in text
    assert "do not fit (e.g. A100-80GB bf16 TP1" in text
    assert "H100-80GB: throughput ±" in text or "no published point" in text

    ranked = json.loads(
        runner.invoke(app, ["plan", "-f", example, "--recommend", "-o", "json"]).stdout
    )
    [report] = ranked
    costs = [o["costPerMillionOutputTokensUsd"] for o in report["options"]]
    assert costs == sorted(costs)
    assert report["meetSlo"] >= len(report["options"]) == 5


def test_plan_recommend_prints_a_ready_model_deployment() -> None:
    example = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    lossless = ["--forbid", "fp8", "--forbid", "int8", "--forbid", "int4", "--forbid", "fp4"]
    result = runner.invoke(app, ["plan", "-f", example, "--recommend", "-o", "yaml", *lossless])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# inferfleet plan --recommend: ")
    document = yaml.safe_load(result.stdout)
    assert document["kind"] == "ModelDeployment"
    assert document["metadata"] == {"name": "llama-3-1-8b"}
    spec = ModelDeploymentSpec.model_validate(document["spec"])
    assert spec.precision.weights.value in ("bf16", "fp16")


def test_plan_recommend_refuses_what_it_cannot_search() -> None:
    example = str(EXAMPLES / "llama-3.1-8b-aggregated-vllm.yaml")
    for args, why in [
        (["-o", "yaml"], "go with --recommend"),
        (["--recommend", "--forbid", "bf16"], "cannot forbid bf16"),
        (["--recommend", "--gpu-type", "TPU"], "--gpu-type/--forbid"),
        (["--recommend", "-o", "yaml", "--pick", "10000"], "--pick 10000"),
    ]:
        result = runner.invoke(app, ["plan", "-f", example, *args])
        assert result.exit_code == EXIT_INVALID, (args, result.output)
        assert why in result.output, (args, result.output)
    no_load = str(EXAMPLES / "llama-3.1-405b-bf16-l40s-does-not-fit.yaml")
    result = runner.invoke(app, ["plan", "-f", no_load, "--recommend"])
    assert result.exit_code == EXIT_INVALID
    assert "--recommend needs a load and an SLO" in result.output
