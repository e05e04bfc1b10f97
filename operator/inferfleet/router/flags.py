"""Flags given as comma-separated `key=value` pairs (`--backend`, `--tenant`). Pure."""

from __future__ import annotations

from collections.abc import Sequence


def key_values(
    text: str, allowed: Sequence[str], *, what: str, error: type[ValueError]
) -> dict[str, str]:
    """The pairs of `text`, each key one of `allowed` and given once; `error` says which is
    not, naming the flag as `what`."""
    fields: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in allowed:
            raise error(
                f"{what} {text!r}: {item!r} is not one of {', '.join(allowed)} as key=value"
            )
        if key in fields:
            raise error(f"{what} {text!r}: {key} given twice")
        fields[key] = value.strip()
    return fields
