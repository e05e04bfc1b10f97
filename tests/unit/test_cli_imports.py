"""What the command line loads, in a fresh interpreter: `inferfleet run` (the operator, in every
pod of the chart) loads no simulator, load generator, dev cluster or weight-cache fill (nor the
Hugging Face client), and help loads none of the heavy modules, so that it answers at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferfleet.bench.autoscale import POLICIES
from inferfleet.cli.bench import BENCH_POLICIES
from inferfleet.cli.cluster import FleetRuntime
from inferfleet.cli.serve import DEFAULT_ELECTION_ID
from inferfleet.devcluster.cluster import Runtime
from inferfleet.reconcile import leadership
from tests.unit.cli_modules import RUN_WITHOUT_A_CLUSTER, modules_loaded_by

NOT_IN_THE_OPERATOR = (
    "inferfleet.sim",
    "inferfleet.bench",
    "inferfleet.devcluster",
    "inferfleet.demo",
    "inferfleet.weights",
    "huggingface_hub",
)
HEAVY = (
    *NOT_IN_THE_OPERATOR,
    "inferfleet.reconcile",
    "inferfleet.autoscale.controller",
    "inferfleet.kube",
    "inferfleet.router.proxy",
    "inferfleet.router.discovery",
    "kopf",
    "kubernetes",
    "aiohttp",
    "httpx",
    "prometheus_api_client",
    "prometheus_client",
    "cryptography",
    "matplotlib",
)


def test_run_loads_the_operator_and_no_simulator_load_generator_or_dev_cluster(
    tmp_path: Path,
) -> None:
    loaded = modules_loaded_by(RUN_WITHOUT_A_CLUSTER, tmp_path)
    assert loaded.code == 1, loaded.stderr
    assert "no Kubernetes configuration" in loaded.stderr
    # It got as far as the operator: what it loads is what a pod runs.
    assert "inferfleet.reconcile.operator" in loaded.modules
    assert "kopf" in loaded.modules
    assert {package: loaded.under(package) for package in NOT_IN_THE_OPERATOR} == {
        package: [] for package in NOT_IN_THE_OPERATOR
    }


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("run", "--help"),
        ("sim-engine", "--help"),
        ("dev-cluster", "up", "--help"),
        ("bench", "autoscale", "--help"),
        ("weights", "fill", "--help"),
    ],
    ids=" ".join,
)
def test_help_loads_none_of_the_heavy_modules(argv: tuple[str, ...], tmp_path: Path) -> None:
    loaded = modules_loaded_by(argv, tmp_path)
    assert loaded.code == 0, loaded.stderr
    assert {module: loaded.under(module) for module in HEAVY} == {module: [] for module in HEAVY}


def test_the_copies_the_command_line_keeps_to_load_less_are_the_originals() -> None:
    """Help shows these without loading the modules that define them."""
    assert BENCH_POLICIES == POLICIES
    assert [runtime.value for runtime in FleetRuntime] == [runtime.value for runtime in Runtime]
    assert DEFAULT_ELECTION_ID == leadership.DEFAULT_ELECTION_ID
