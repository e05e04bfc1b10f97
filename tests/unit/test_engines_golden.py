"""Engine containers per engine and role, compared with golden files in tests/unit/golden/engines.

Regenerate after an intended change: INFERFLEET_UPDATE_GOLDEN=1 pytest tests/unit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.engines import EngineContainer, build_engine_container
from tests.unit.golden import check_golden
from tests.unit.golden.specs import (
    CUSTOM_ARCHITECTURE,
    EAGLE,
    EAGLE3,
    INT4_AWQ,
    PVC_DRAFT_MODEL,
    PVC_NGRAM,
    aggregated_spec,
    disaggregated_spec,
    merged,
)


@dataclass(frozen=True)
class Case:
    name: str
    spec: Callable[[], ModelDeploymentSpec]
    role: Role


def _on(engine_name: str, **changes: Any) -> Callable[[], ModelDeploymentSpec]:
    return lambda: aggregated_spec(**merged(changes, {"engine": {"name": engine_name}}))


def _disaggregated_on(engine: str) -> Callable[[], ModelDeploymentSpec]:
    return lambda: disaggregated_spec(engine={"name": engine})


AGGREGATED = Role.AGGREGATED
CASES = [
    # The examples, and each of them on the other engines.
    Case("vllm-aggregated", aggregated_spec, Role.AGGREGATED),
    Case("tensorrt-llm-aggregated", _on("tensorrt-llm"), Role.AGGREGATED),
    Case("sim-aggregated", _on("sim"), Role.AGGREGATED),
    Case("tensorrt-llm-prefill", disaggregated_spec, Role.PREFILL),
    Case("tensorrt-llm-decode", disaggregated_spec, Role.DECODE),
    Case("vllm-prefill", _disaggregated_on("vllm"), Role.PREFILL),
    Case("vllm-decode", _disaggregated_on("vllm"), Role.DECODE),
    Case("sim-prefill", _disaggregated_on("sim"), Role.PREFILL),
    Case("sim-decode", _disaggregated_on("sim"), Role.DECODE),
    # Quantized, speculative, volume sources, a model given in full.
    Case("vllm-int4-awq", _on("vllm", **INT4_AWQ, gpu={"type": "L40S-48GB"}), Role.AGGREGATED),
    Case("tensorrt-llm-int4-awq", _on("tensorrt-llm", **INT4_AWQ), Role.AGGREGATED),
    Case("vllm-eagle3", _on("vllm", **EAGLE3), Role.AGGREGATED),
    Case("vllm-eagle", _on("vllm", **EAGLE), Role.AGGREGATED),
    Case("tensorrt-llm-eagle3", _on("tensorrt-llm", **EAGLE3), Role.AGGREGATED),
    Case("vllm-pvc-fp8-ngram", _on("vllm", **PVC_NGRAM), Role.AGGREGATED),
    Case("tensorrt-llm-pvc-fp8-ngram", _on("tensorrt-llm", **PVC_NGRAM), Role.AGGREGATED),
    Case("tensorrt-llm-pvc-draft-model", lambda: aggregated_spec(**PVC_DRAFT_MODEL), AGGREGATED),
    Case("sim-custom-architecture", lambda: aggregated_spec(**CUSTOM_ARCHITECTURE), AGGREGATED),
]  # fmt: skip


def as_documents(engine: EngineContainer) -> list[Any]:
    """What the golden file holds: the container, then what the pod must provide."""
    return [
        engine.container,
        {
            "gpus": engine.gpus,
            "metricsPath": engine.metrics_path,
            "runAsUser": engine.run_as_user,
            "coldStartSeconds": engine.cold_start_seconds,
            "volumes": engine.volumes,
            "configFiles": engine.config_files,
        },
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_engine_container_matches_golden(case: Case) -> None:
    engine = build_engine_container(case.spec(), case.role, model_name="served-name")
    check_golden(f"engines/{case.name}.yaml", as_documents(engine))


def test_cases_have_distinct_names() -> None:
    assert len({c.name for c in CASES}) == len(CASES)
