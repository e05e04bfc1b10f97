"""Where the dev cluster's OCI runtime mode finds inferfleet's images: built by
tools/images/build.sh (cached outside the work tree by version) into a store of OCI layouts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

IMAGES_VARIABLE = "INFERFLEET_IMAGES_DIR"
BUILD_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "images" / "build.sh"
IMAGES = ("operator", "router", "sim-engine")


class ImagesUnavailableError(RuntimeError):
    pass


def ensure_images() -> Path:
    """The image store: $INFERFLEET_IMAGES_DIR, or the build script's cache (building on
    first use, which takes minutes; progress goes to stderr)."""
    configured = os.environ.get(IMAGES_VARIABLE)
    if configured:
        directory = Path(configured)
    elif BUILD_SCRIPT.exists():
        result = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if result.returncode != 0 or not result.stdout.strip():
            raise ImagesUnavailableError(
                f"{BUILD_SCRIPT} failed with exit status {result.returncode}"
            )
        directory = Path(result.stdout.strip().splitlines()[-1])
    else:
        raise ImagesUnavailableError(
            f"no images: set {IMAGES_VARIABLE} to a directory of OCI layouts, or run from a "
            "checkout that has tools/images/build.sh"
        )
    missing = [name for name in IMAGES if not (directory / name / "index.json").is_file()]
    if missing:
        raise ImagesUnavailableError(f"{directory} lacks the OCI layouts {', '.join(missing)}")
    return directory
