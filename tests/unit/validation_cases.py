"""The table of specs that pydantic and the CRDs must judge alike (tests/cases/validation.yaml).

Loadable on its own, so that a tier with a real API server can replay the same cases.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from inferfleet.api import inference_service, model_deployment
from inferfleet.api.common import CrossFieldRule, WireModel

CASES_FILE = Path(__file__).resolve().parents[1] / "cases" / "validation.yaml"

Kind = Literal["ModelDeployment", "InferenceService"]
_SECTIONS: dict[str, Kind] = {
    "modelDeployments": "ModelDeployment",
    "inferenceServices": "InferenceService",
}
# Importing the resource modules defines every model class that `all_cross_field_rules` walks.
RESOURCE_MODULES = (model_deployment, inference_service)
_CASE_KEYS = {"id", "valid", "field", "spec"}


@dataclass(frozen=True)
class ValidationCase:
    kind: Kind
    id: str
    valid: bool  # the API server's verdict
    spec: dict[str, Any]
    field: str | None = None  # for refused specs: the path both validators must name

    @property
    def test_id(self) -> str:
        return f"{self.kind}/{self.id}"


def _case(kind: Kind, entry: dict[str, Any]) -> ValidationCase:
    unknown = set(entry) - _CASE_KEYS
    if unknown:
        raise ValueError(f"{kind} case {entry.get('id')!r}: unknown keys {sorted(unknown)}")
    case = ValidationCase(
        kind=kind,
        id=entry["id"],
        valid=entry["valid"],
        # A copy: YAML anchors make cases share fragments, and nothing may leak between them.
        spec=copy.deepcopy(entry["spec"]),
        field=entry.get("field"),
    )
    if not case.valid and not case.field:
        raise ValueError(f"{case.test_id}: a refused case must name its field")
    return case


def load_cases(path: Path = CASES_FILE) -> list[ValidationCase]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    cases = [_case(kind, entry) for section, kind in _SECTIONS.items() for entry in data[section]]
    ids = [case.test_id for case in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    return cases


def all_cross_field_rules() -> list[tuple[type[WireModel], CrossFieldRule[Any]]]:
    """Every rule of every API model (the ones the table must break), found through the model
    classes, so a new model's rules are covered without being listed here."""
    found: list[tuple[type[WireModel], CrossFieldRule[Any]]] = []
    pending: list[type[WireModel]] = [WireModel]
    while pending:
        model = pending.pop()
        pending += model.__subclasses__()
        if model is not WireModel and "cross_field_rules" in vars(model):
            found += [(model, rule) for rule in model.cross_field_rules]
    return sorted(found, key=lambda pair: (pair[0].__name__, pair[1].cel))
