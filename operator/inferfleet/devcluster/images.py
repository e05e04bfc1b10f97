"""Where the dev cluster's OCI runtime mode finds inferfleet's images: built by
tools/images/build.sh (cached outside the work tree by version) into a store of OCI layouts."""

from __future__ import annotations

from pathlib import Path

from inferfleet.devcluster.tools import TOOLS_DIR, ToolUnavailableError, cached_tool

IMAGES_VARIABLE = "INFERFLEET_IMAGES_DIR"
BUILD_SCRIPT = TOOLS_DIR / "images" / "build.sh"
IMAGES = ("operator", "router", "sim-engine")


class ImagesUnavailableError(ToolUnavailableError):
    pass


def ensure_images() -> Path:
    """The image store: $INFERFLEET_IMAGES_DIR, or the build script's cache (building on
    first use, which takes minutes; progress goes to stderr)."""
    try:
        directory = cached_tool(IMAGES_VARIABLE, BUILD_SCRIPT)
    except ToolUnavailableError as error:
        raise ImagesUnavailableError(f"no images (a directory of OCI layouts): {error}") from None
    missing = [name for name in IMAGES if not (directory / name / "index.json").is_file()]
    if missing:
        raise ImagesUnavailableError(f"{directory} lacks the OCI layouts {', '.join(missing)}")
    return directory
