"""Golden files: rendered output committed next to the tests, compared byte for byte.

Regenerate after an intended change with `INFERFLEET_UPDATE_GOLDEN=1 pytest tests/unit`, then
review the diff like any other change.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

GOLDEN_DIR = Path(__file__).resolve().parent
UPDATE_ENV = "INFERFLEET_UPDATE_GOLDEN"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (embedded config files) as literal blocks, readable in a diff."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def dump(documents: Sequence[Any]) -> str:
    return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False, explicit_start=True)


def updating() -> bool:
    return os.environ.get(UPDATE_ENV) == "1"


def check_text(path: Path, text: str) -> None:
    """`path` holds exactly `text`; with INFERFLEET_UPDATE_GOLDEN=1 it is (re)written."""
    if updating():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    hint = f"regenerate with {UPDATE_ENV}=1 and review the diff"
    assert path.exists(), f"{path} is missing: {hint}"
    committed = path.read_text(encoding="utf-8")
    if committed != text:
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{path.name} (committed)",
                f"{path.name} (rendered)",
            )
        )
        raise AssertionError(f"{path} differs from the rendered output ({hint}):\n{diff}")


def check_golden(name: str, documents: Sequence[Any]) -> None:
    check_text(GOLDEN_DIR / name, dump(documents))
