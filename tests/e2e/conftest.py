"""The e2e tier: a real control plane (etcd, kube-apiserver, controller manager, scheduler and
kwok with fake GPU nodes) started once per session, stopped however the session ends."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.kube import Kube

POOLS = NodePool.parse("H100-80GB=2,L4-24GB=1")


@dataclass(frozen=True)
class Kubectl:
    binary: Path
    kubeconfig: Path

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), "kubectl", f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, input=stdin, check=False, timeout=60,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{result.stderr}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    bin_dir = ensure_binaries()
    with running(tmp_path_factory.mktemp("dev-cluster"), bin_dir, POOLS) as dev_cluster:
        dev_cluster.install_crds()
        yield dev_cluster


@pytest.fixture(scope="session")
def kubectl(cluster: DevCluster) -> Kubectl:
    return Kubectl(ensure_binaries() / "kube", cluster.kubeconfig_path)


@pytest.fixture(scope="session")
def kube(cluster: DevCluster) -> Kube:
    return Kube.from_kubeconfig(cluster.kubeconfig_path)


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    # Readable, and unique per test case even when parameters are cut off.
    readable = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    digest = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8]
    name = f"e2e-{readable}-{digest}"
    kubectl.run("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false")
