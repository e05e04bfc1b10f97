"""The generated CRDs: up to date, structural, documented, and consistent with themselves."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft4Validator
from kubernetes.client import ApiClient

from inferfleet.api.common import API_GROUP, API_VERSION, CEL_RULES_KEY
from inferfleet.api.crd import crd_files, custom_resource_definitions
from tests.unit.apiserver_emulation import admit, compile_rule, rule_holds, schema_at
from tests.unit.validation_cases import all_cross_field_rules

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMITTED_CRDS = REPO_ROOT / "crds"

CRDS = {crd["spec"]["names"]["kind"]: crd for crd in custom_resource_definitions()}

# What a structural schema may not hold (or, for these CRDs, should not need).
FORBIDDEN_KEYWORDS = frozenset(
    {"$ref", "$defs", "definitions", "anyOf", "allOf", "oneOf", "not", "title", "const"}
    | {"nullable", "patternProperties", "propertyNames"}
)
# The reasons the API server accepts on a validation rule.
RULE_REASONS = frozenset(
    {"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"}
)
COLUMN_TYPES = {"integer": {"integer"}, "number": {"number", "integer"}, "string": {"string"}}

Schema = Mapping[str, Any]
NodePath = tuple[str, ...]

by_kind = pytest.mark.parametrize("kind", sorted(CRDS))


def version_of(kind: str) -> dict[str, Any]:
    (version,) = CRDS[kind]["spec"]["versions"]
    return version  # type: ignore[no-any-return]


def schema_of(kind: str) -> dict[str, Any]:
    return version_of(kind)["schema"]["openAPIV3Schema"]  # type: ignore[no-any-return]


def walk(node: Schema, path: NodePath = ()) -> Iterator[tuple[NodePath, Schema]]:
    """Every schema node below `node` (included), with its path; `[]` stands for list items."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, (*path, name))
    if "items" in node:
        yield from walk(node["items"], (*path, "[]"))


def rules_with_nodes() -> Iterator[tuple[str, NodePath, Schema, dict[str, str]]]:
    for kind in sorted(CRDS):
        for path, node in walk(schema_of(kind)):
            for rule in node.get(CEL_RULES_KEY, ()):
                yield kind, path, node, rule


def test_committed_crds_are_up_to_date() -> None:
    fresh = crd_files()
    committed = {path.name: path.read_text("utf-8") for path in COMMITTED_CRDS.glob("*.yaml")}
    hint = "crds/ is out of date with the models in operator/inferfleet/api: run `inferfleet crds`"
    assert sorted(committed) == sorted(fresh), hint
    for name, content in fresh.items():
        assert committed[name] == content, f"{name}: {hint}"


def test_file_names_follow_group_and_plural() -> None:
    names = sorted(crd_files())
    assert names == ["inferfleet.io_inferenceservices.yaml", "inferfleet.io_modeldeployments.yaml"]


@by_kind
def test_every_key_is_known_to_apiextensions_v1(kind: str) -> None:
    """A key the API types do not know (a typo such as `jsonpath`) is lost when the CRD goes
    through the Kubernetes client's typed model and back."""
    crd = CRDS[kind]
    with ApiClient() as client:
        typed = client.deserialize(
            json.dumps(crd), "V1CustomResourceDefinition", "application/json"
        )
        round_tripped = client.sanitize_for_serialization(typed)
    assert json.dumps(round_tripped, sort_keys=True) == json.dumps(crd, sort_keys=True)


@pytest.mark.parametrize(
    ("kind", "plural", "short_names", "scale"),
    [
        ("ModelDeployment", "modeldeployments", ["mdep"], True),
        ("InferenceService", "inferenceservices", ["infsvc"], False),
    ],
)
def test_names_scope_and_subresources(
    kind: str, plural: str, short_names: list[str], scale: bool
) -> None:
    spec = CRDS[kind]["spec"]
    assert CRDS[kind]["metadata"]["name"] == f"{plural}.{API_GROUP}"
    assert spec["group"] == API_GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == plural
    assert spec["names"]["singular"] == kind.lower()
    assert spec["names"]["shortNames"] == short_names
    assert spec["names"]["categories"] == ["inferfleet"]
    version = version_of(kind)
    assert (version["name"], version["served"], version["storage"]) == (API_VERSION, True, True)
    assert version["subresources"]["status"] == {}
    assert ("scale" in version["subresources"]) is scale


@by_kind
def test_schema_has_no_json_schema_only_keywords(kind: str) -> None:
    found = [
        f"{'.'.join(path)}: {sorted(FORBIDDEN_KEYWORDS & set(node))}"
        for path, node in walk(schema_of(kind))
        if FORBIDDEN_KEYWORDS & set(node)
    ]
    assert not found


@by_kind
def test_maps_are_maps_of_one_schema(kind: str) -> None:
    """A structural schema's map (`additionalProperties`) has one value schema, no
    `properties` beside it, and a bounded size."""
    maps = [(path, node) for path, node in walk(schema_of(kind)) if "additionalProperties" in node]
    for path, node in maps:
        where = ".".join(path)
        assert "properties" not in node, where
        assert isinstance(node["additionalProperties"], dict), where
        assert node.get("maxProperties"), where


@by_kind
def test_every_spec_and_status_property_is_described(kind: str) -> None:
    schema = schema_of(kind)["properties"]
    undocumented = [
        ".".join((root, *path))
        for root in ("spec", "status")
        for path, node in walk(schema[root])
        if path[-1:] != ("[]",) and not node.get("description", "").strip()
    ]
    assert not undocumented


@by_kind
def test_schema_is_structural(kind: str) -> None:
    problems = []
    for path, node in walk(schema_of(kind)):
        where = ".".join(path) or "<root>"
        free_form = node.get("x-kubernetes-preserve-unknown-fields") or node.get(
            "x-kubernetes-int-or-string"
        )
        if "type" not in node and not free_form:
            problems.append(f"{where}: no type")
        if "properties" in node and node.get("type") != "object":
            problems.append(f"{where}: properties on a non-object")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{where}: array without items")
        for required in node.get("required", ()):
            if required not in node.get("properties", {}):
                problems.append(f"{where}: requires unknown {required}")
    assert not problems


@by_kind
def test_schema_is_valid_openapi_v3_subset(kind: str) -> None:
    # OpenAPI v3.0 schemas are Draft 4 in the parts Kubernetes uses (boolean exclusive bounds).
    Draft4Validator.check_schema(schema_of(kind))


@by_kind
def test_defaults_pass_their_own_validation(kind: str) -> None:
    """The API server refuses a CRD whose defaults (after nested defaulting) fail the schema or
    its rules."""
    for path, node in walk(schema_of(kind)):
        if "default" in node:
            admission = admit(node["default"], node)
            assert admission.admitted, f"{'.'.join(path)}: {admission.errors}"


@by_kind
def test_object_defaults_satisfy_their_rules_as_written(kind: str) -> None:
    """The API server evaluates a node's CEL rules on its default exactly as written, without
    first filling in the nested defaults: a rule reading a field the default omits fails the
    whole CRD ("no such key"), so object defaults must spell every field out."""
    for path, node in walk(schema_of(kind)):
        default = node.get("default")
        if not isinstance(default, dict):
            continue
        for rule in node.get(CEL_RULES_KEY, ()):
            assert rule_holds(rule["rule"], default, node), f"{'.'.join(path)}: {rule['rule']}"


def test_scale_subresource_points_at_schema_fields() -> None:
    scale = version_of("ModelDeployment")["subresources"]["scale"]
    schema = schema_of("ModelDeployment")
    expected = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert scale == expected
    types = {key: (schema_at(schema, scale[key].strip(".").split(".")) or {}) for key in scale}
    assert types["specReplicasPath"].get("type") == "integer"
    assert types["statusReplicasPath"].get("type") == "integer"
    assert types["labelSelectorPath"].get("type") == "string"


_FILTER = re.compile(r'\[\?\(@\.(\w+)=="[^"]*"\)\]')


def column_schema(schema: Schema, json_path: str) -> Schema | None:
    """The schema node a printer column reads, following `[?(@.field=="x")]` filters into list
    items (whose `field` must exist too)."""
    node: Schema | None = schema
    for segment in _FILTER.sub(r"[?\1]", json_path).strip(".").split("."):
        name, _, filtered = segment.partition("[?")
        node = schema_at(node or {}, [name])
        if node is None:
            return None
        if filtered:
            items = node.get("items", {})
            if filtered.rstrip("]") not in items.get("properties", {}):
                return None
            node = items
    return node


@by_kind
def test_printer_columns_read_fields_of_the_right_type(kind: str) -> None:
    schema = schema_of(kind)
    columns = version_of(kind)["additionalPrinterColumns"]
    assert columns[-1]["jsonPath"] == ".metadata.creationTimestamp"
    assert any(column.get("priority") == 1 for column in columns)
    for column in columns:
        if column["jsonPath"].startswith(".metadata."):
            continue
        node = column_schema(schema, column["jsonPath"])
        assert node is not None, column
        assert node.get("type") in COLUMN_TYPES[column["type"]], column
        assert column["description"], column


def test_crd_rules_are_exactly_the_models_rules() -> None:
    in_crds = {rule["rule"] for _, _, _, rule in rules_with_nodes()}
    in_models = {rule.cel for _, rule in all_cross_field_rules()}
    assert in_crds == in_models


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(rule["rule"], id=f"{kind}:{'.'.join(path) or 'root'}:{index}")
        for index, (kind, path, _, rule) in enumerate(rules_with_nodes())
    ],
)
def test_cel_rule_compiles(rule: str) -> None:
    compile_rule(rule)


def test_cel_rule_fields_are_accepted_by_the_api_server() -> None:
    for kind, path, node, rule in rules_with_nodes():
        where = f"{kind} {'.'.join(path)}: {rule['rule']}"
        assert rule.get("reason", "FieldValueInvalid") in RULE_REASONS, where
        assert rule["message"].strip(), where
        assert "\n" not in rule["message"], where
        if "fieldPath" in rule:
            # Relative and pointing at an existing field: the API server checks both on apply.
            assert rule["fieldPath"].startswith("."), where
            assert schema_at(node, rule["fieldPath"].strip(".").split(".")) is not None, where


_SELF_FIELDS = re.compile(r"\bself((?:\.\w+)+)")
_STRING_LITERAL = re.compile(r"\"[^\"]*\"|'[^']*'")
_INT_LITERAL = re.compile(r"(?<![\w.])\d+(?![\w.])")


def test_cel_regexes_with_escapes_are_raw_strings() -> None:
    """CEL's plain strings take no escape such as a backslash before a dot (the API server
    refuses the rule; celpy, which the offline checks use, does not): a regex with one is
    written as a raw string."""
    plain_with_escape = re.compile(r"(?<![rR])'[^']*\\[^']*'")
    rules = [rule["rule"] for _, _, _, rule in rules_with_nodes()]
    offending = [rule for rule in rules if plain_with_escape.search(rule)]
    assert not offending


def test_cel_rules_do_not_mix_int_and_double() -> None:
    """CEL refuses to compare an int with a double (and celpy does not), so a rule that reads a
    `number` field must write its literals as doubles (`0.5`, `1.0`)."""
    for kind, _, node, rule in rules_with_nodes():
        text = _STRING_LITERAL.sub('""', rule["rule"])
        number_fields = [
            ref
            for ref in _SELF_FIELDS.findall(text)
            if (schema_at(node, ref.strip(".").split(".")) or {}).get("type") == "number"
        ]
        if number_fields:
            assert not _INT_LITERAL.search(text), f"{kind}: {rule['rule']} reads {number_fields}"


def test_fields_cel_rules_read_are_bounded() -> None:
    """The API server estimates each rule's cost from maxItems and maxLength; an unbounded list
    or string that a rule reads can make the CRD exceed the cost budget and be refused."""
    unbounded = []
    for kind, _, node, rule in rules_with_nodes():
        for path, sub in walk(node):
            name = next((part for part in reversed(path) if part != "[]"), None)
            if name is None or not re.search(rf"\.{re.escape(name)}\b", rule["rule"]):
                continue
            kind_of = sub.get("type")
            if kind_of == "array" and "maxItems" not in sub:
                unbounded.append(f"{kind}: {'.'.join(path)} (maxItems)")
            is_bounded_string = "maxLength" in sub or "enum" in sub
            if kind_of == "string" and not is_bounded_string:
                unbounded.append(f"{kind}: {'.'.join(path)} (maxLength)")
    assert not unbounded
