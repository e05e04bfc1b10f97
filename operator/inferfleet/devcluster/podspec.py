"""What a kubelet resolves in a pod's container spec before it runs anything: `$(VAR)`
references and the container's environment (values and the downward API's `fieldRef`s)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values: a defined variable is
    replaced, an undefined reference stays as written, `$$` is a literal `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(replace, text)


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """A `fieldRef` path, as the downward API resolves it."""
    metadata, spec, status = (pod.get(k) or {} for k in ("metadata", "spec", "status"))
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    found = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if found:
        return str((metadata.get(found.group(1)) or {}).get(found.group(2), ""))
    raise ValueError(f"fieldRef {path!r} is not supported by the fleet agent")


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    """The container's `env`, in order: values (with earlier variables expanded) and
    `fieldRef`s. Other sources (Secrets, ConfigMaps, resources) are not resolved."""
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        name = str(variable["name"])
        if "value" in variable:
            env[name] = expand_references(str(variable["value"]), env)
        elif (variable.get("valueFrom") or {}).get("fieldRef"):
            env[name] = field_value(pod, str(variable["valueFrom"]["fieldRef"]["fieldPath"]))
        else:
            raise ValueError(f"env {name}: only value and fieldRef are supported")
    return env
