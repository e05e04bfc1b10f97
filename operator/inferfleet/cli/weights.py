"""`inferfleet weights fill` and `wait`: a ModelDeployment's weight cache, filled by its Job
and awaited by its replicas (`render.weight_cache`). Each imports the Hugging Face client
and the Kubernetes client only when it runs."""

# ruff: noqa: PLC0415

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from inferfleet.cli.common import EXIT_INVALID, app

weights = typer.Typer(
    help="Fill a weight cache, or wait for its fill (what a ModelDeployment's model.cache runs).",
    no_args_is_help=True,
)
app.add_typer(weights, name="weights")

Directory = Annotated[Path, typer.Option(help="The weights' directory on the cache's volume.")]


def _log() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@weights.command("fill")
def fill_command(
    source: Annotated[str, typer.Option(help="The hub source: hf://org/repo.")],
    directory: Directory,
    progress_config_map: Annotated[
        str | None,
        typer.Option(
            help="The ConfigMap of the pod's namespace (POD_NAMESPACE) to push "
            "progress to; none: progress is only logged."
        ),
    ] = None,
    job: Annotated[
        str, typer.Option(envvar="JOB_NAME", help="The Job this fill runs in (said in pushes).")
    ] = "",
) -> None:
    """Download the files of SOURCE a replica reads into DIRECTORY, resuming what is there,
    and write the marker replicas wait for."""
    if not source.startswith("hf://") or not source.removeprefix("hf://").strip("/"):
        typer.echo(f"error: --source {source!r}: expected hf://org/repo", err=True)
        raise typer.Exit(EXIT_INVALID)
    _log()
    from inferfleet import weights as cache

    push = cache.config_map_push(progress_config_map) if progress_config_map else None
    report = cache.fill(source, directory, job=job or os.environ.get("HOSTNAME", ""), push=push)
    typer.echo(report.describe())


@weights.command("wait")
def wait_command(directory: Directory) -> None:
    """Return once DIRECTORY holds the fill's marker."""
    _log()
    from inferfleet import weights as cache

    cache.wait(directory)
