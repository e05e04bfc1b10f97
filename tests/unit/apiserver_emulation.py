"""What the API server does with a custom resource's spec, emulated offline against a CRD schema.

The steps follow the API server's order for a create with strict field validation (kubectl's
default): drop nulls where a default applies, refuse unknown fields, apply structural defaults,
validate the OpenAPI schema, and only then evaluate the `x-kubernetes-validations` CEL rules,
each at the node that carries it. Paths are relative to the validated root and written as
Kubernetes writes them (`deployments[0].name`).

Of the Kubernetes CEL libraries, the quantity functions the rules use are emulated
(`KUBERNETES_FUNCTIONS`). Known gaps, none of which the CRDs here depend on: regex dialect
(Python's `re` for Go's RE2), CEL's string escapes (celpy takes a backslash before a dot in
a plain string, the API server refuses it; `test_crds.py` checks for it), `format` checks,
CEL's refusal to compare int with double (celpy allows it; `test_crds.py` checks the rules
for that statically) and CEL cost limits.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal, cast

import celpy
from celpy import celtypes
from celpy.evaluation import CELEvalError
from jsonschema import Draft4Validator
from kubernetes.utils import parse_quantity

CEL_RULES_KEY = "x-kubernetes-validations"
PRESERVE_UNKNOWN_FIELDS = "x-kubernetes-preserve-unknown-fields"

# The Kubernetes client's parser, which has no annotations.
_parse_quantity = cast("Callable[[str], Decimal]", parse_quantity)

Origin = Literal["unknown-field", "schema", "cel"]


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str
    origin: Origin
    rule: str | None = None  # the CEL rule, for origin "cel"


@dataclass(frozen=True)
class Admission:
    """The object as the API server would store it (nulls dropped, defaults applied), and why
    it would be refused; no errors means admitted."""

    value: Any
    errors: tuple[FieldError, ...]

    @property
    def admitted(self) -> bool:
        return not self.errors


def join_path(parts: Iterable[str | int]) -> str:
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path.lstrip(".")


def _child_schema(schema: Mapping[str, Any], key: str | int) -> Mapping[str, Any] | None:
    if isinstance(key, int):
        items: Mapping[str, Any] | None = schema.get("items")
        return items
    properties: Mapping[str, Any] = schema.get("properties", {})
    if key in properties:
        sub: Mapping[str, Any] = properties[key]
        return sub
    additional = schema.get("additionalProperties")
    return additional if isinstance(additional, Mapping) else None


def _prune_nulls(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A null where the schema has a default is dropped, so that the default applies in its
    place; any other null stays and fails type validation (as the real API server does)."""
    if isinstance(value, dict):
        pruned = {}
        for key, item in value.items():
            sub = _child_schema(schema, key) if schema is not None else None
            if item is None and "default" in (sub or {}) and not (sub or {}).get("nullable"):
                continue
            pruned[key] = _prune_nulls(item, sub)
        return pruned
    if isinstance(value, list):
        sub = _child_schema(schema, 0) if schema is not None else None
        return [_prune_nulls(item, sub) for item in value]
    return value


def _unknown_fields(
    value: Any, schema: Mapping[str, Any], path: list[str | int]
) -> list[FieldError]:
    if schema.get(PRESERVE_UNKNOWN_FIELDS):
        return []
    errors: list[FieldError] = []
    if isinstance(value, dict):
        has_properties = "properties" in schema
        for key, item in value.items():
            sub = _child_schema(schema, key)
            if sub is None:
                if has_properties:
                    errors.append(
                        FieldError(join_path([*path, key]), "unknown field", "unknown-field")
                    )
                continue
            errors += _unknown_fields(item, sub, [*path, key])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += _unknown_fields(item, schema["items"], [*path, index])
    return errors


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """Structural defaulting: an absent property with a default gets a copy of it, and defaulting
    then goes on inside it, so `default: {}` picks up the nested properties' defaults."""
    if isinstance(value, dict):
        properties: Mapping[str, Any] = schema.get("properties", {})
        result = dict(value)
        for name, sub in properties.items():
            if name not in result and "default" in sub:
                result[name] = copy.deepcopy(sub["default"])
        for name, item in result.items():
            child = _child_schema(schema, name)
            if child is not None:
                result[name] = apply_defaults(item, child)
        return result
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def _schema_errors(value: Any, schema: Mapping[str, Any]) -> list[FieldError]:
    # OpenAPI v3.0 is Draft 4 in this respect: exclusiveMinimum is a boolean next to minimum.
    errors: list[FieldError] = []
    for error in Draft4Validator(schema).iter_errors(value):
        path = list(error.absolute_path)
        if error.validator == "required":
            missing = [name for name in error.validator_value if name not in error.instance]
            errors += [
                FieldError(join_path([*path, name]), "Required value", "schema") for name in missing
            ]
        else:
            errors.append(FieldError(join_path(path), error.message, "schema"))
    return errors


@dataclass(frozen=True, order=True)
class _Quantity:
    """A value of the Kubernetes CEL quantity library (`quantity("64Gi")`), parsed by the
    Kubernetes client's own parser."""

    value: Decimal


def _quantity(text: celtypes.StringType) -> _Quantity:
    return _Quantity(_parse_quantity(str(text)))


def _compare_to(left: _Quantity, right: _Quantity) -> celtypes.IntType:
    return celtypes.IntType((left > right) - (left < right))


# The Kubernetes CEL library functions the CRDs' rules use, beyond standard CEL.
KUBERNETES_FUNCTIONS: Final = {"quantity": _quantity, "compareTo": _compare_to}


@functools.cache
def compile_rule(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    # celpy's stubs type a function's result as a CEL value only; it passes any other value
    # (the quantity library's `_Quantity`) on to the functions that take it.
    return environment.program(
        environment.compile(rule),
        functions=KUBERNETES_FUNCTIONS,  # type: ignore[arg-type]
    )


def to_cel(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """A JSON value as CEL sees it in Kubernetes: `type: number` is always a double, even when
    the JSON holds an integer."""
    if isinstance(value, dict):
        return celtypes.MapType(
            {
                celtypes.StringType(key): to_cel(item, _child_schema(schema or {}, key))
                for key, item in value.items()
            }
        )
    if isinstance(value, list):
        items = (schema or {}).get("items")
        return celtypes.ListType([to_cel(item, items) for item in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if (schema or {}).get("type") == "number" or isinstance(value, float):
        return celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    raise TypeError(f"no CEL value for {value!r}")


def rule_holds(rule: str, value: Any, schema: Mapping[str, Any]) -> bool:
    """True only when the rule evaluates to true; false, a runtime error (a missing key, a
    division by zero) and a non-boolean result all refuse the object, as in Kubernetes."""
    try:
        result = compile_rule(rule).evaluate({"self": to_cel(value, schema)})
    except CELEvalError:
        return False
    return isinstance(result, celtypes.BoolType) and bool(result)


def _cel_errors(value: Any, schema: Mapping[str, Any], path: list[str | int]) -> list[FieldError]:
    errors: list[FieldError] = []
    for rule in schema.get(CEL_RULES_KEY, ()):
        if not rule_holds(rule["rule"], value, schema):
            where = join_path(path) + rule.get("fieldPath", "")
            errors.append(FieldError(where.lstrip("."), rule["message"], "cel", rule["rule"]))
    if isinstance(value, dict):
        for key, item in value.items():
            child = _child_schema(schema, key)
            if child is not None:
                errors += _cel_errors(item, child, [*path, key])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += _cel_errors(item, schema["items"], [*path, index])
    return errors


def admit(obj: Any, schema: Mapping[str, Any]) -> Admission:
    """Emulate the API server admitting `obj` (for example a spec) against `schema` (the CRD's
    schema of that node)."""
    value = _prune_nulls(copy.deepcopy(obj), schema)
    errors = _unknown_fields(value, schema, [])
    value = apply_defaults(value, schema)
    errors += _schema_errors(value, schema)
    if not errors:
        # CEL runs on schema-valid objects only; its rules may assume the declared types.
        errors = _cel_errors(value, schema, [])
    return Admission(value, tuple(errors))


def schema_at(schema: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any] | None:
    """The schema node at a dotted path of property names, or None where there is none."""
    node: Mapping[str, Any] | None = schema
    for part in path:
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node
