"""pydantic and the CRDs (OpenAPI schema plus CEL rules) accept and refuse the same specs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from inferfleet.api import InferenceServiceSpec, ModelDeploymentSpec
from inferfleet.api.crd import custom_resource_definitions
from tests.unit.apiserver_emulation import Admission, admit, join_path
from tests.unit.validation_cases import Kind, ValidationCase, all_cross_field_rules, load_cases

CASES = load_cases()

SPEC_MODELS: dict[Kind, type[BaseModel]] = {
    "ModelDeployment": ModelDeploymentSpec,
    "InferenceService": InferenceServiceSpec,
}


def _spec_schemas() -> dict[str, dict[str, Any]]:
    schemas = {}
    for crd in custom_resource_definitions():
        (version,) = crd["spec"]["versions"]
        schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]["properties"][
            "spec"
        ]
    return schemas


SPEC_SCHEMAS = _spec_schemas()


RULES = all_cross_field_rules()


@dataclass(frozen=True)
class PydanticVerdict:
    accepted: bool
    paths: frozenset[str]  # fields the errors name
    messages: tuple[str, ...]


def pydantic_verdict(kind: Kind, spec: dict[str, Any]) -> PydanticVerdict:
    try:
        SPEC_MODELS[kind].model_validate(spec)
    except ValidationError as exc:
        paths: set[str] = set()
        messages = []
        for error in exc.errors():
            location = join_path(error["loc"])
            paths.add(location)
            messages.append(error["msg"])
            # A cross-field rule fails at its model; the field it blames lies below.
            for _, rule in RULES:
                if rule.field_path and rule.message in error["msg"]:
                    paths.add((location + rule.field_path).lstrip("."))
        return PydanticVerdict(False, frozenset(paths), tuple(messages))
    return PydanticVerdict(True, frozenset(), ())


def _describe(pydantic: PydanticVerdict, server: Admission) -> str:
    server_errors = [f"{e.path}: {e.message} ({e.origin})" for e in server.errors]
    return f"pydantic: {list(pydantic.messages)}; API server: {server_errors}"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.test_id) for c in CASES])
def test_pydantic_and_api_server_agree(case: ValidationCase) -> None:
    pydantic = pydantic_verdict(case.kind, case.spec)
    server = admit(case.spec, SPEC_SCHEMAS[case.kind])

    assert pydantic.accepted == server.admitted, _describe(pydantic, server)
    assert server.admitted == case.valid, _describe(pydantic, server)
    if not case.valid:
        assert case.field in pydantic.paths, _describe(pydantic, server)
        assert case.field in {e.path for e in server.errors}, _describe(pydantic, server)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.test_id) for c in CASES if c.valid])
def test_api_server_defaults_match_pydantic_defaults(case: ValidationCase) -> None:
    """The object the API server stores parses to the model pydantic builds from the input: a
    CRD default that differs from the model's would show up as a different field value."""
    model = SPEC_MODELS[case.kind]
    stored = admit(case.spec, SPEC_SCHEMAS[case.kind]).value
    assert model.model_validate(stored) == model.model_validate(case.spec)


def test_every_cross_field_rule_is_broken_by_a_case() -> None:
    """Each rule refuses at least one case on both sides: CEL reports it, pydantic names it."""
    broken: set[str] = set()
    for case in CASES:
        if case.valid:
            continue
        pydantic = pydantic_verdict(case.kind, case.spec)
        for error in admit(case.spec, SPEC_SCHEMAS[case.kind]).errors:
            if error.rule and any(error.message in msg for msg in pydantic.messages):
                broken.add(error.rule)
    missing = [f"{model.__name__}: {rule.cel}" for model, rule in RULES if rule.cel not in broken]
    assert not missing, "rules no case breaks:\n" + "\n".join(missing)


def test_rules_were_found() -> None:
    models = {model.__name__ for model, _ in RULES}
    assert {"ModelDeploymentSpec", "InferenceServiceSpec", "ModelArchitecture"} <= models
    assert len(RULES) >= 20


def test_table_size() -> None:
    for kind, least in (("ModelDeployment", 40), ("InferenceService", 15)):
        cases = [c for c in CASES if c.kind == kind]
        assert len(cases) >= least, kind
        assert any(c.valid for c in cases), kind
        assert sum(not c.valid for c in cases) >= least // 2, kind


def test_an_unknown_model_is_one_error_not_a_cascade() -> None:
    """Rules about the architecture hold vacuously for a model nobody described, so the user
    sees the one error that matters rather than made-up layer counts."""
    spec = {
        "model": {"name": "gpt-17", "source": "hf://a/b"},
        "engine": {"name": "vllm"},
        "gpu": {"type": "H100-80GB"},
        "parallelism": {"pipeline": 2},
        "batching": {"maxModelLength": 4096, "chunkedPrefill": False},
    }
    errors = admit(spec, SPEC_SCHEMAS["ModelDeployment"]).errors
    assert [e.path for e in errors] == ["model.name"]
    # One error, raised at `model` and blaming `model.name`.
    verdict = pydantic_verdict("ModelDeployment", spec)
    assert len(verdict.messages) == 1
    assert verdict.paths == frozenset({"model", "model.name"})
