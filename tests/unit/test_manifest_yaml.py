"""Rendered objects as YAML: a string stays a string for kubectl's reader as well as PyYAML's."""

from __future__ import annotations

import re

import pytest
import yaml

from inferfleet.render.manifest_yaml import dump_manifests

# go-yaml's resolution of a plain scalar to a float (its resolve.go), which kubectl reads with.
KUBECTL_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


@pytest.mark.parametrize(
    "text", ["3719e80514256271", "1e5", "12E3", "+1e-5", ".5e3", "1234", "1.5", "0042"]
)
def test_a_string_kubectl_would_read_as_a_number_is_quoted(text: str) -> None:
    assert KUBECTL_FLOAT.match(text)
    dumped = dump_manifests([{"metadata": {"annotations": {"digest": text}}}])
    assert f"digest: '{text}'" in dumped
    [read] = yaml.safe_load_all(dumped)
    assert read["metadata"]["annotations"]["digest"] == text


def test_other_strings_and_numbers_are_written_as_before() -> None:
    objects = [{"kind": "Deployment", "spec": {"replicas": 3, "name": "e123", "hash": "12e"}}]
    dumped = dump_manifests(objects, explicit_start=True)
    assert dumped == "---\nkind: Deployment\nspec:\n  replicas: 3\n  name: e123\n  hash: 12e\n"
    assert list(yaml.safe_load_all(dumped)) == objects
