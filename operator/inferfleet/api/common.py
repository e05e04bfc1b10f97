"""Shared building blocks of the API: wire conventions, conditions and cross-field rules.

Every cross-field rule is declared once as a `CrossFieldRule`: a CEL expression that the API
server evaluates (emitted as `x-kubernetes-validations`) next to the Python predicate that the
pydantic model evaluates. A unit test proves the two agree on a table of specs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel, to_snake

API_GROUP = "inferfleet.io"
API_VERSION = "v1alpha1"
MAX_REPLICAS = 1000
"""The most replicas a pool may be given (spec, bounds, pins)."""

CEL_RULES_KEY = "x-kubernetes-validations"

ModelT = TypeVar("ModelT", bound=BaseModel)

# The only reasons the API server accepts on a validation rule.
RuleReason = Literal[
    "FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"
]


@dataclass(frozen=True)
class CrossFieldRule(Generic[ModelT]):
    """One validation rule, written for both the API server (CEL) and pydantic (Python).

    `cel` is evaluated with `self` bound to the object the rule is attached to; `holds` is the
    same predicate on the pydantic model. `field_path` is the JSONPath (relative to that object)
    that the API server reports, so `kubectl apply` points at the offending field.
    """

    cel: str
    message: str
    holds: Callable[[ModelT], bool]
    field_path: str | None = None
    reason: RuleReason = "FieldValueInvalid"

    def explain(self, model: ModelT) -> str:
        """The error for `model`: the field, the rule, and the value found there."""
        if not self.field_path:
            return self.message
        value: Any = model
        for part in self.field_path.strip(".").split("."):
            value = getattr(value, to_snake(part), None)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json", by_alias=True, exclude_none=True)
        elif isinstance(value, StrEnum):
            value = value.value
        return f"{self.field_path.strip('.')}: {self.message} (got {value!r})"

    def to_crd(self) -> dict[str, str]:
        rule: dict[str, str] = {"rule": self.cel, "message": self.message}
        if self.field_path:
            rule["fieldPath"] = self.field_path
        rule["reason"] = self.reason
        return rule


def _emit_cel_rules(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Place a model's cross-field rules on its own schema node, as the CRD wants them."""
    rules: Sequence[CrossFieldRule[Any]] = getattr(model, "cross_field_rules", ())
    if rules:
        schema[CEL_RULES_KEY] = [rule.to_crd() for rule in rules]


class _Null:
    """An explicit null on the wire: no field type accepts it, so the error lands on the field."""

    def __repr__(self) -> str:
        return "null"


NULL = _Null()

_WIRE_ALIASES = AliasGenerator(alias=to_camel)


class WireModel(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python, unknown fields
    refused (a typo in a spec is an error, not a silently ignored setting).

    Types are strict, as the API server's are: "2" is not an integer, "true" not a boolean.
    Enum fields opt out (`strict=False`) so that their wire strings validate from a dict.
    A subclass lists its `cross_field_rules`; they are checked here and emitted as CEL.
    """

    model_config = ConfigDict(
        alias_generator=_WIRE_ALIASES,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        validate_default=True,
        json_schema_extra=_emit_cel_rules,
    )

    cross_field_rules: ClassVar[Sequence[CrossFieldRule[Any]]] = ()

    @model_validator(mode="before")
    @classmethod
    def _nulls_as_the_api_server_treats_them(cls, data: Any) -> Any:
        """A null where a default exists is dropped, so the default applies; any other null of a
        known field is refused at that field, as the API server refuses it ("must be of type")."""
        if not isinstance(data, dict) or None not in data.values():
            return data
        fields = {
            name: info
            for field_name, info in cls.model_fields.items()
            for name in (field_name, info.alias)
        }
        cleaned = {}
        for key, value in data.items():
            info = fields.get(key)
            if value is None and info is not None:
                if info.default_factory is None and info.default is None:
                    cleaned[key] = NULL
                continue
            cleaned[key] = value
        return cleaned

    @model_validator(mode="after")
    def _check_cross_field_rules(self) -> Self:
        for rule in self.cross_field_rules:
            if not rule.holds(self):
                raise ValueError(rule.explain(self))
        return self

    def to_wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class StatusModel(WireModel):
    """Status is written by the operator; unknown fields from newer operators are tolerated,
    and timestamps arrive as RFC 3339 strings."""

    model_config = ConfigDict(extra="ignore", strict=False)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(StatusModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str = Field(
        description="Type of condition in CamelCase, for example Ready or Fits.",
        pattern=r"^[A-Z][A-Za-z0-9]*$",
        max_length=316,
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(
        description="Machine-readable CamelCase reason for the last transition.",
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
    )
    message: str = Field(
        default="", description="Human-readable details, with numbers.", max_length=32768
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was set from."
    )
    last_transition_time: datetime = Field(
        description="When the status last changed (not when the condition was last checked)."
    )
