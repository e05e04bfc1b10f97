"""What every `inferfleet` command shares: the application and its exit statuses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError

from inferfleet import __version__
from inferfleet.api.catalog import GpuCatalog

EXIT_INVALID = 2
# Planned fine, but a deployment does not fit or cannot meet its SLO: lets pipelines gate on it.
EXIT_NO_FIT = 3

GPU_CATALOG_EXAMPLE = "{H100-80GB: {hourlyPriceUsd: 2.1}, L4-24GB: {hourlyPriceUsd: 0.7}}"
GPU_CATALOG_HELP = (
    "YAML overriding GPU figures: GPU type to the fields to change, e.g. a file holding "
    f"`{GPU_CATALOG_EXAMPLE}`."
)


app = typer.Typer(
    help="inferfleet: plan, validate and operate LLM inference fleets on Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"inferfleet {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """inferfleet: plan, validate and operate LLM inference fleets on Kubernetes."""


def load_gpu_catalog(overrides: Path | None) -> GpuCatalog:
    """The built-in GPU catalog with the overrides of a YAML file (None: none). Raises
    `ValueError` naming the file and what is wrong with it."""
    catalog = GpuCatalog.builtin()
    if overrides is None:
        return catalog
    try:
        data = yaml.safe_load(overrides.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError("expected a mapping of GPU type to figures")
        return catalog.with_overrides(data)
    except OSError as error:
        raise ValueError(f"{overrides}: cannot read: {error.strerror}") from None
    except (yaml.YAMLError, ValueError, ValidationError) as error:
        raise ValueError(f"{overrides}: {error}") from None
