"""The GPU step benchmark measures the work the planner models, and its report is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.gpu_roofline.cases import compare, measured_load, plan

from inferfleet.api.catalog import GpuType, catalog_models
from inferfleet.planning.calibration import PUBLISHED_POINTS

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"


@pytest.mark.parametrize("gpu_type", [GpuType.H100_80GB, GpuType.H200_141GB])
def test_a_steady_state_case_carries_the_prompt_work_of_its_max_throughput_step(
    gpu_type: GpuType,
) -> None:
    planned = plan(gpu_type.value)
    steady = [case for case in planned["cases"] if case["label"].startswith("max throughput")]
    fp8_models = {c["model"] for c in planned["cases"] if c["weights"] == "fp8"}
    published = [
        p
        for p in PUBLISHED_POINTS
        if p.gpu_type is gpu_type and p.concurrency is None and p.reference_gpu is None and p.fp8
        and p.tensor == 1 and p.model in fp8_models
    ]  # fmt: skip
    assert len(steady) == len(published) > 0
    for case in steady:
        lengths = case["label"].split()[2].split("/")
        input_tokens, output_tokens = int(lengths[0]), int(lengths[1])
        batch = case["decode_sequences"]
        load = measured_load(case)
        # performance.max_throughput: batch x input / output prompt tokens per step, each
        # attending to input / 2 positions on average; decodes at input + output / 2.
        prompt_tokens = batch * input_tokens / output_tokens
        assert load.prefill_tokens == pytest.approx(prompt_tokens, rel=0.1, abs=1)
        assert load.prefill_attention_pairs == pytest.approx(
            prompt_tokens * input_tokens / 2, rel=0.1
        )
        assert case["decode_context"] == input_tokens + output_tokens // 2


def test_models_whose_weights_crowd_out_the_caches_are_not_planned() -> None:
    on_h100 = {(c["model"], c["weights"]) for c in plan("H100-80GB")["cases"]}
    on_h200 = {(c["model"], c["weights"]) for c in plan("H200-141GB")["cases"]}
    assert ("llama-3.3-70b", "fp8") in on_h200 - on_h100
    for name, shape in plan("H200-141GB")["models"].items():
        model = catalog_models()[name]
        assert (shape["layers"], shape["kv_heads"], shape["intermediate"]) == (
            model.layers,
            model.kv_heads,
            model.intermediate_size,
        )


def test_the_committed_report_is_what_the_planner_says_beside_the_committed_measurements() -> None:
    measurements = [
        json.loads((RESULTS / f"gpu_roofline_{gpu}.json").read_text()) for gpu in ("h100", "h200")
    ]
    assert all("error" not in case for m in measurements for case in m["cases"])
    assert compare(measurements) == (RESULTS / "gpu_roofline.md").read_text(), (
        "regenerate: python -m benchmarks.gpu_roofline compare "
        "benchmarks/results/gpu_roofline_h100.json benchmarks/results/gpu_roofline_h200.json "
        "> benchmarks/results/gpu_roofline.md"
    )
