"""What every `inferfleet` command shares: the application and its exit statuses."""

from __future__ import annotations

from typing import Annotated

import typer

from inferfleet import __version__

EXIT_INVALID = 2
# Planned fine, but a deployment does not fit or cannot meet its SLO: lets pipelines gate on it.
EXIT_NO_FIT = 3


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
