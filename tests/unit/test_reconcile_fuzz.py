"""10,000 fuzzed objects through the desired-state functions, with a fixed seed: whatever the
API server may hold (an older or newer schema's spec, a hand-edited status, a broken pin), a
reconcile returns an outcome and never raises. An exception here would be a crash-looping
operator there."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import yaml

from inferfleet.api.pins import PIN_ANNOTATION
from inferfleet.autoscale.ownership import claims_of
from inferfleet.reconcile.desired import (
    Namespace,
    inference_service_outcome,
    model_deployment_outcome,
)
from inferfleet.render import InstallSettings
from tests.unit.test_reconcile_desired import NOW

ROOT = Path(__file__).resolve().parents[2]
CASES = 10_000
SEED = 20261123

ODD_VALUES: tuple[Any, ...] = (
    None, "", "x", "true", "4", "-1", -1, 0, 1, 3, 2**31, 2**63, 1.5, float("nan"), True,
    False, [], [{}], {}, {"name": None}, "a" * 300, "llama-3-1-8b", "aggregated",
    "disaggregated", "fp8", "int4", "H100-80GB", "B200", "vllm", "tensorrt-llm", "sim",
)  # fmt: skip
PINS: tuple[str, ...] = (
    "not json", "{}", "[]", '{"replicas": {"aggregated": 2147483648}}',
    '{"replicas": {"aggregated": true}, "reason": "x", "until": "2026-11-23T13:00:00Z"}',
    '{"replicas": {"decode": 1}, "reason": "x", "until": "2026-11-23T13:00:00Z"}',
    '{"replicas": {"aggregated": 2}, "reason": "x", "until": "2026-11-23T13:00:00Z"}',
    '{"replicas": {"aggregated": 2}, "reason": "x", "until": "2036-11-23T13:00:00Z"}',
)  # fmt: skip


def _documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        found += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return found


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            paths += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            paths += _paths(value, (*prefix, index))
    return paths


def _mutate(body: dict[str, Any], rng: random.Random) -> None:
    candidates = [p for p in _paths(body) if p and p[0] in ("spec", "status")]
    if not candidates:
        return
    path = rng.choice(candidates)
    parent: Any = body
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    action = rng.random()
    if action < 0.3 and isinstance(parent, dict):
        del parent[last]
    elif action < 0.4 and isinstance(parent, dict):
        parent[rng.choice(["extra", "replicas", "weight", "conditions"])] = rng.choice(ODD_VALUES)
    else:
        parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))


def _fuzzed(rng: random.Random, documents: list[dict[str, Any]]) -> dict[str, Any]:
    body = copy.deepcopy(rng.choice(documents))
    body["metadata"] |= {"namespace": "llm", "uid": "u", "generation": rng.randint(0, 3)}
    if rng.random() < 0.2:
        body["metadata"]["annotations"] = {PIN_ANNOTATION: rng.choice(PINS)}
    if rng.random() < 0.2:
        body["status"] = {
            "conditions": rng.choice(ODD_VALUES),
            "autoscaling": rng.choice(ODD_VALUES),
        }
    for _ in range(rng.randint(0, 3)):
        _mutate(body, rng)
    return body


def test_no_fuzzed_object_makes_a_reconcile_raise() -> None:
    rng = random.Random(SEED)
    documents = _documents()
    deployments = [d for d in documents if d["kind"] == "ModelDeployment"]
    install = InstallSettings()
    applied = 0
    for _ in range(CASES):
        body = _fuzzed(rng, documents)
        if body["kind"] == "ModelDeployment":
            service = _fuzzed(rng, [d for d in documents if d["kind"] == "InferenceService"])
            outcome = model_deployment_outcome(
                body, space=Namespace(), claims=list(claims_of(service).values()),
                unschedulable={}, install=install, now=NOW,
            )  # fmt: skip
        else:
            backends = {str(d["metadata"]["name"]): d for d in deployments}
            outcome = inference_service_outcome(
                body, space=Namespace(), backends=backends, install=install, now=NOW
            )
        applied += bool(outcome.apply)
        json.dumps(outcome.status)  # what is written must be JSON
    # The fuzzing reaches the renderers, not only the schema's refusals.
    assert applied > CASES // 10
