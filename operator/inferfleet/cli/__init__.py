"""`inferfleet`: capacity plans, rendering, the operator, the router, the engine emulator, the
local cluster and benchmarks, from the command line. One module per group of commands; each
registers its commands with the application of `common`."""

# isort: off
# Imported in the order `inferfleet --help` lists their commands.
from inferfleet.cli import specs
from inferfleet.cli import serve
from inferfleet.cli import cluster
from inferfleet.cli import bench
from inferfleet.cli import weights

# isort: on
from inferfleet.cli.common import (
    EXIT_INVALID,
    EXIT_NO_FIT,
    GPU_CATALOG_EXAMPLE,
    GPU_CATALOG_HELP,
    app,
)

__all__ = [
    "EXIT_INVALID",
    "EXIT_NO_FIT",
    "GPU_CATALOG_EXAMPLE",
    "GPU_CATALOG_HELP",
    "app",
    "bench",
    "cluster",
    "main",
    "serve",
    "specs",
    "weights",
]


def main() -> None:
    app(prog_name="inferfleet")
