#!/usr/bin/env bash
# Regenerates runtime_images/requirements.lock: inferfleet's runtime dependencies (no extras)
# for the images' interpreter (CPython 3.11, manylinux x86_64), each pinned with its hashes.
# The versions are those installed in the project's .venv, the ones the tests ran against;
# uv resolves them for the image's platform and writes every published file's hash.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
UV_VERSION=0.13.8

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m venv "$work/uv"
"$work/uv/bin/pip" install --quiet "uv==$UV_VERSION"

# The .venv's closure of inferfleet's requirements, as constraints.
"$python" - >"$work/constraints.txt" <<'PY'
import importlib.metadata as metadata
import re

from packaging.requirements import Requirement

seen: dict[str, str] = {}


def walk(name: str) -> None:
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return
    distribution = metadata.distribution(name)
    seen[key] = distribution.version
    for line in distribution.requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            walk(requirement.name)


walk("inferfleet")
for name, version in sorted(seen.items()):
    if name != "inferfleet":
        print(f"{name}=={version}")
PY

{
    echo "# inferfleet's runtime dependencies for the operator, router and sim-engine images"
    echo "# (CPython 3.11, manylinux_2_36 x86_64), with hashes: tools/images/build.sh installs"
    echo "# them with --require-hashes. Regenerate with tools/images/lock.sh."
    (cd "$repo" && "$work/uv/bin/uv" pip compile --quiet pyproject.toml \
        --constraint "$work/constraints.txt" --python-version 3.11 \
        --python-platform x86_64-manylinux_2_36 --generate-hashes --no-header --no-annotate)
} >"$repo/runtime_images/requirements.lock"
echo "$repo/runtime_images/requirements.lock"
