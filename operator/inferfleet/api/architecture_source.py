"""A ModelDeployment whose architecture is a Hugging Face config.json in a ConfigMap
(`model.architectureFrom`): the body as if the architecture were given in full. Pure: the caller
hands in the ConfigMap's data (the operator fetches it; `inferfleet plan` finds it in the file)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferfleet.api.hf_config import UnsupportedConfigError, architecture_from_hf_config


@dataclass(frozen=True)
class ConfigMapKey:
    name: str
    key: str


def architecture_source(body: Mapping[str, Any]) -> ConfigMapKey | None:
    """The ConfigMap key a ModelDeployment body reads its architecture from (None: none)."""
    spec = body.get("spec")
    model = spec.get("model") if isinstance(spec, Mapping) else None
    source = model.get("architectureFrom") if isinstance(model, Mapping) else None
    ref = source.get("configMapKeyRef") if isinstance(source, Mapping) else None
    if not isinstance(ref, Mapping) or not isinstance(ref.get("name"), str):
        return None
    key = ref.get("key", "config.json")
    return ConfigMapKey(ref["name"], key if isinstance(key, str) else "config.json")


@dataclass(frozen=True)
class ReadArchitecture:
    body: Mapping[str, Any]
    """The body with `model.architecture` in full in place of `architectureFrom` (the body
    given, when it has no source or the source could not be read)."""
    problem: str | None = None
    """Why the source could not be read (None: read, or no source)."""


def read_architecture(
    body: Mapping[str, Any], config_map_data: Mapping[str, Any] | None
) -> ReadArchitecture:
    """`body` with its architecture read from `config_map_data`, the data of the ConfigMap
    `architecture_source(body)` names (None: no such ConfigMap)."""
    source = architecture_source(body)
    if source is None:
        return ReadArchitecture(body)
    where = f"ConfigMap {source.name}"
    if config_map_data is None:
        return ReadArchitecture(body, f"{where} not found in the namespace")
    if source.key not in config_map_data:
        keys = ", ".join(sorted(config_map_data)) or "none"
        return ReadArchitecture(body, f"{where} has no key {source.key} (its keys: {keys})")
    text = config_map_data[source.key]
    if not isinstance(text, str):
        return ReadArchitecture(body, f"{where} key {source.key} is not text")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        return ReadArchitecture(body, f"{where} key {source.key} is not JSON: {error}")
    if not isinstance(config, dict):
        return ReadArchitecture(body, f"{where} key {source.key} is not a JSON object")
    try:
        architecture = architecture_from_hf_config(config)
    except UnsupportedConfigError as error:
        return ReadArchitecture(body, f"{where} key {source.key}: {error}")
    read = copy.deepcopy(dict(body))
    model = read["spec"]["model"]
    del model["architectureFrom"]
    model["architecture"] = architecture.to_wire()
    return ReadArchitecture(read)
