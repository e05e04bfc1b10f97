"""Thousands of random and malformed specs: each is accepted, or refused with an error that
names the field. Nothing else may raise, and the planner never fails on an accepted spec."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from inferfleet.api.inference_service import InferenceServiceSpec
from inferfleet.api.model_deployment import ModelDeploymentSpec
from inferfleet.planning.capacity import Workload, plan, report
from inferfleet.slo import Slo

VALID_DEPLOYMENT: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"name": "vllm", "extraArgs": ["--seed", "1"]},
    "precision": {"weights": "fp8", "method": "fp8", "kvCache": "fp8"},
    "parallelism": {"tensor": 2, "pipeline": 1},
    "batching": {"maxSequences": 128, "maxBatchedTokens": 4096, "chunkedPrefill": True,
                 "maxModelLength": 16384},
    "prefixCaching": True,
    "speculativeDecoding": {"method": "eagle", "draftModel": "hf://a/b", "numTokens": 3},
    "gpu": {"type": "H100-80GB", "memoryUtilization": 0.9},
    "topology": {"mode": "disaggregated", "prefill": {"replicas": 2}},
    "replicas": 3,
}  # fmt: skip

VALID_SERVICE: dict[str, Any] = {
    "deployments": [{"name": "a", "weight": 90}, {"name": "b", "weight": 10}],
    "slo": {"ttftP95Ms": 500, "tpotP95Ms": 40, "attainmentTarget": 0.99},
    "expectedLoad": {"requestsPerSecond": 10, "inputTokens": 1000, "outputTokens": 200},
    "autoscaling": {"policy": "goodput", "decode": {"minReplicas": 1, "maxReplicas": 4},
                    "gpuBudget": 16},
}  # fmt: skip

CATALOG_WORDS = [
    "llama-3.1-8b", "llama-3.3-70b", "llama-3.1-405b", "qwen2.5-7b", "mixtral-8x7b", "gpt-17",
    "H100-80GB", "L4-24GB", "B200-180GB", "H100", "vllm", "tensorrt-llm", "sim", "int4", "fp8",
    "awq", "gptq", "smoothquant", "disaggregated", "aggregated", "ngram", "mtp", "",
]  # fmt: skip

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 3, 7, 8, 16, 64, 65, 10**9, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(CATALOG_WORDS),
    st.text(max_size=20),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(document: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    found: list[tuple[str | int, ...]] = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """A valid document with a few fields replaced, removed or added."""
    document = copy.deepcopy(base)
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        paths = _paths(document)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = document
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "remove", "add"]))
        if action == "replace" or not isinstance(parent, dict):
            parent[path[-1]] = draw(values)
        elif action == "remove":
            del parent[path[-1]]
        else:
            parent[draw(st.text(min_size=1, max_size=10))] = draw(values)
    return document if draw(st.integers(0, 50)) else draw(values)


# A cross-field error names its field first ("parallelism.tensor: ..."); rules that concern the
# whole object say so in words.
_FIELD_FIRST = re.compile(r"^Value error, [A-Za-z][\w.]*: ")
_WHOLE_OBJECT_RULES = ("an SLO needs",)


def assert_names_the_field(error: ValidationError) -> None:
    for item in error.errors():
        if item["loc"]:
            continue
        message = item["msg"]
        assert (
            _FIELD_FIRST.match(message)
            or any(r in message for r in _WHOLE_OBJECT_RULES)
            or (item["type"] in ("model_type", "model_attributes_type", "dict_type"))
        ), f"error names no field: {item}"


workloads = st.builds(
    Workload,
    requests_per_second=st.floats(min_value=0, max_value=2000),
    input_tokens=st.integers(min_value=1, max_value=200_000),
    output_tokens=st.integers(min_value=1, max_value=20_000),
)
slos = st.builds(
    Slo,
    ttft_p95_ms=st.one_of(st.none(), st.floats(min_value=1, max_value=100_000)),
    tpot_p95_ms=st.one_of(st.none(), st.floats(min_value=0.1, max_value=10_000)),
)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=mutated(VALID_DEPLOYMENT), workload=st.one_of(st.none(), workloads), slo=slos)
def test_deployment_specs_are_accepted_or_refused_by_field(
    document: Any, workload: Workload | None, slo: Slo
) -> None:
    try:
        spec = ModelDeploymentSpec.model_validate(document)
    except ValidationError as error:
        assert_names_the_field(error)
        return
    capacity = plan(spec, workload=workload, slo=slo)
    # The plan is plain, finite data: it serialises without NaN or infinity.
    json.dumps(report(capacity), allow_nan=False)
    assert capacity.memory.kv_capacity_tokens >= 0
    if capacity.meets_slo:
        assert all(
            role.point is not None and math.isfinite(role.point.step_s) for role in capacity.roles
        )


@settings(max_examples=1000, deadline=None)
@given(document=mutated(VALID_SERVICE))
def test_service_specs_are_accepted_or_refused_by_field(document: Any) -> None:
    try:
        InferenceServiceSpec.model_validate(document)
    except ValidationError as error:
        assert_names_the_field(error)


@given(
    rate=st.floats(allow_nan=True, allow_infinity=True),
    input_tokens=st.integers(min_value=-(2**40), max_value=2**40),
    output_tokens=st.integers(min_value=-(2**40), max_value=2**40),
)
def test_workloads_are_refused_with_a_clear_message(
    rate: float, input_tokens: int, output_tokens: int
) -> None:
    valid = rate >= 0 and math.isfinite(rate) and input_tokens >= 1 and output_tokens >= 1
    if valid:
        Workload(rate, input_tokens, output_tokens)
    else:
        with pytest.raises(ValueError, match="must be"):
            Workload(rate, input_tokens, output_tokens)
