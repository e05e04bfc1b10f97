"""Objects as a YAML stream that kubectl reads back as they are.

PyYAML quotes a string only where its own reader (YAML 1.1) would take it for something else;
kubectl's reader takes more plain scalars for numbers. A 16-character hex digest such as
`3719e80514256271` is a float to kubectl (`json: cannot unmarshal number into Go struct field
ObjectMeta.metadata.annotations of type string`), and about one digest in 1,300 has that
form. The dumper here quotes every string kubectl's reader would resolve to a number too."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml


class _KubectlSafeDumper(yaml.SafeDumper):
    """PyYAML's safe dumper, quoting what kubectl's reader (go-yaml) takes for a number."""


# go-yaml's plain float: digits with an exponent and no dot count, where YAML 1.1 needs a dot.
_KubectlSafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$"),
    list("-+.0123456789"),
)


def dump_manifests(objects: Iterable[Mapping[str, Any]], *, explicit_start: bool = False) -> str:
    """The objects as one YAML stream, in the order given, each object's keys as given."""
    return yaml.dump_all(
        [dict(obj) for obj in objects],
        Dumper=_KubectlSafeDumper,
        sort_keys=False,
        explicit_start=explicit_start,
    )
