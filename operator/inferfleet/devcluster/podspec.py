"""What a kubelet resolves in a pod's container spec before it runs anything: `$(VAR)`
references and the container's environment (values and the downward API's `fieldRef`s)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
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


SecretValue = Callable[[str, str], str]
"""A Secret's value by (Secret name, key) in the pod's namespace; ValueError when it has none."""


def container_env(
    pod: Mapping[str, Any], container: Mapping[str, Any], secret: SecretValue | None = None
) -> dict[str, str]:
    """The container's `env`, in order: values (with earlier variables expanded),
    `fieldRef`s, and `secretKeyRef`s where `secret` reads Secrets. Other sources
    (ConfigMaps, resources) are not resolved."""
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        name = str(variable["name"])
        source = variable.get("valueFrom") or {}
        if "value" in variable:
            env[name] = expand_references(str(variable["value"]), env)
        elif source.get("fieldRef"):
            env[name] = field_value(pod, str(source["fieldRef"]["fieldPath"]))
        elif source.get("secretKeyRef") and (
            secret is not None or source["secretKeyRef"].get("optional")
        ):
            # An optional key that is not there leaves the variable unset, as a kubelet
            # leaves it; without `secret` (the venv mode reads no Secret) it is not there.
            reference = source["secretKeyRef"]
            try:
                if secret is None:
                    continue
                env[name] = secret(str(reference["name"]), str(reference["key"]))
            except ValueError:
                if not reference.get("optional"):
                    raise
        else:
            raise ValueError(
                f"env {name}: only value, fieldRef and (images) secretKeyRef are supported"
            )
    return env
