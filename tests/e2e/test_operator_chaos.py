"""The operator killed at 50 random moments while 50 services change under it, and restarted
each time: at the end every object converges to what its resource says, nothing is orphaned
or duplicated, and no autoscaling decision is lost (the decisions live in the cluster, in
each service's status, not in the operator's memory).

The services autoscale (`policy: goodput`) with no Prometheus, so each tick holds the last
decision; the test writes decisions where ticks write them (the service's `status.replicas`),
as a loaded fleet's autoscaler would, since 50 emulated fleets do not fit on this machine. The
operator under test is what must carry every decision, spec change, pin and deletion through
its kills.
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import DevCluster, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl
from tests.e2e.test_operator import (
    OPERATOR_NAMESPACE,
    RBAC,
    Operator,
    _service_account_kubeconfig,
    _sim_deployment,
)

SERVICES = 50
KILLS = 50
SEED = 13
NAMESPACE = "chaos"
POOLS = NodePool.parse("L4-24GB=8")  # 64 GPUs: every replica the test asks for fits


@pytest.fixture(scope="module")
def chaos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    with running(tmp_path_factory.mktemp("chaos-cluster"), ensure_binaries(), POOLS) as cluster:
        cluster.install_crds()
        yield cluster


@pytest.fixture(scope="module")
def chaos_kubectl(chaos_cluster: DevCluster) -> Kubectl:
    return Kubectl(ensure_binaries() / "kube", chaos_cluster.kubeconfig_path)


def _deployment(name: str) -> dict[str, Any]:
    found = _sim_deployment(name)
    found["metadata"]["namespace"] = NAMESPACE
    return found


def _service(name: str, deployment: str, *, autoscaled: bool) -> dict[str, Any]:
    autoscaling = {"policy": "goodput", "aggregated": {"maxReplicas": 3}} if autoscaled else {}
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "deployments": [{"name": deployment}],
            "slo": {"ttftP95Ms": 500, "tpotP95Ms": 50, "attainmentTarget": 0.99},
            "autoscaling": autoscaling or {"policy": "none"},
        },
    }


def _autoscaled(md: str) -> bool:
    """Half the services autoscale their deployment; the other half's are pinned by hand.
    (A pin also becomes the autoscaler's decision while it holds, so mixing both on one
    deployment would make the expected end state depend on whether a tick saw the pin.)"""
    return int(md.rsplit("-", 1)[1]) % 2 == 0


class Driver:
    """Random changes of the kinds users, Git and the autoscaler make, and what each
    deployment must end up running because of them."""

    def __init__(self, kubectl: Kubectl, rng: random.Random) -> None:
        self.kubectl = kubectl
        self.rng = rng
        self.spec = {f"md-{i}": 1 for i in range(SERVICES)}
        self.decided: dict[str, int] = {}
        self.pinned: dict[str, int] = {}
        self.services = {f"md-{i}": f"svc-{i}" for i in range(SERVICES)}

    def expected(self, md: str) -> int:
        if md in self.pinned:
            return self.pinned[md]
        if md in self.services and _autoscaled(md):
            # Its ticks hold their last decision, the spec's count until the first written.
            return self.decided.get(md, self.spec[md])
        return self.spec[md]

    def step(self) -> None:
        md = self.rng.choice(sorted(self.spec))
        action = self.rng.choice(("scale", "decide", "pin", "unpin", "delete-service"))
        if action == "scale" and not (_autoscaled(md) and md in self.services):
            self.spec[md] = self.rng.randint(1, 2)
            self._patch("mdep", md, {"spec": {"replicas": self.spec[md]}})
        elif action == "decide" and md in self.services and _autoscaled(md):
            self.decided[md] = self.rng.randint(1, 3)
            decision = [{"deployment": md, "role": "aggregated", "replicas": self.decided[md]}]
            self._patch("infsvc", self.services[md], {"status": {"replicas": decision}}, "status")
        elif action == "pin" and not _autoscaled(md):
            self.pinned[md] = self.rng.randint(1, 3)
            until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
            pin = {"replicas": {"aggregated": self.pinned[md]}, "reason": "chaos", "until": until}
            self.kubectl.run(
                "annotate", "mdep", md, "-n", NAMESPACE, "--overwrite",
                f"inferfleet.io/pin={json.dumps(pin)}",
            )  # fmt: skip
        elif action == "unpin" and md in self.pinned:
            del self.pinned[md]
            self.kubectl.run("annotate", "mdep", md, "-n", NAMESPACE, "inferfleet.io/pin-")
        elif action == "delete-service" and md in self.services:
            name = self.services.pop(md)
            self.decided.pop(md, None)
            self.kubectl.run("delete", "infsvc", name, "-n", NAMESPACE, "--wait=false")

    def _patch(self, kind: str, name: str, patch: dict[str, Any], subresource: str = "") -> None:
        extra = [f"--subresource={subresource}"] if subresource else []
        self.kubectl.run(
            "patch", kind, name, "-n", NAMESPACE, "--type=merge", "-p", json.dumps(patch), *extra
        )


def _items(kubectl: Kubectl, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = kubectl.json("get", kind, "-n", NAMESPACE)["items"]
    return found


def _converged(kubectl: Kubectl, driver: Driver) -> list[str]:
    """What still differs from what the resources say (empty: converged)."""
    problems = []
    deployments = {d["metadata"]["name"]: d for d in _items(kubectl, "deployments")}
    for md in _items(kubectl, "modeldeployments"):
        name = md["metadata"]["name"]
        engine = deployments.get(f"{name}-aggregated")
        want = driver.expected(name)
        if engine is None or engine["spec"]["replicas"] != want:
            got = None if engine is None else engine["spec"]["replicas"]
            problems.append(f"{name}: {got} replicas, want {want}")
        ready = [c for c in md.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        current = md.get("status", {}).get("observedGeneration") == md["metadata"]["generation"]
        if not (ready and ready[0]["status"] == "True" and current):
            problems.append(f"{name}: not Ready at its generation")
    uids = {o["metadata"]["uid"] for kind in ("mdep", "infsvc") for o in _items(kubectl, kind)}
    for kind in ("deployments", "services", "poddisruptionbudgets", "serviceaccounts"):
        names = [o["metadata"]["name"] for o in _items(kubectl, kind)]
        if len(names) != len(set(names)):
            problems.append(f"duplicate {kind}")
        for obj in _items(kubectl, kind):
            owners = [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]
            if (
                obj["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by")
                == ("inferfleet")
                and not set(owners) & uids
            ):
                problems.append(f"orphan {kind}/{obj['metadata']['name']}")
    for service in _items(kubectl, "infsvc"):
        md = service["spec"]["deployments"][0]["name"]
        held = service.get("status", {}).get("replicas") or []
        if md in driver.decided and held != [
            {"deployment": md, "role": "aggregated", "replicas": driver.decided[md]}
        ]:
            problems.append(f"{service['metadata']['name']}: decision lost ({held})")
    return problems


@pytest.mark.timeout(600)
def test_killed_at_random_moments_the_operator_converges_and_loses_nothing(
    chaos_cluster: DevCluster, chaos_kubectl: Kubectl, tmp_path: Path
) -> None:
    kubectl = chaos_kubectl
    kubectl.run("create", "namespace", OPERATOR_NAMESPACE)
    kubectl.run("create", "namespace", NAMESPACE)
    for manifest in sorted(RBAC.glob("*.yaml")):
        kubectl.run("apply", "--server-side", "-f", str(manifest))
    operator = Operator(
        _service_account_kubeconfig(kubectl, chaos_cluster, tmp_path / "kubeconfig"),
        tmp_path / "operator.log",
    )
    operator.start()
    rng = random.Random(SEED)
    driver = Driver(kubectl, rng)
    documents = [
        doc
        for i in range(SERVICES)
        for doc in (
            _deployment(f"md-{i}"),
            _service(f"svc-{i}", f"md-{i}", autoscaled=_autoscaled(f"md-{i}")),
        )
    ]
    kubectl.run("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(documents))
    try:
        for _ in range(KILLS):
            deadline = time.monotonic() + rng.uniform(0.5, 2.5)
            while time.monotonic() < deadline:
                driver.step()
            operator.stop(signal.SIGKILL)
            operator.start()
        assert wait_until(lambda: not _converged(kubectl, driver), 180, 3), (
            _converged(kubectl, driver)[:20],
            operator.tail(),
        )
    finally:
        operator.stop()
