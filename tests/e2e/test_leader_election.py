"""Two `inferfleet run --leader-elect` processes on a real control plane, each as its own
least-privilege service account: one holds the Lease and acts while the other only waits (the
API server's audit log shows who wrote), the follower takes over within 15 s of the leader's
SIGKILL in the middle of a rollout, which then converges without a duplicated Event; a leader
stopped with SIGTERM hands over at once, and one whose Lease is taken exits non-zero."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml

from inferfleet.devcluster.cluster import DevCluster
from inferfleet.devcluster.processes import wait_until
from tests.e2e.conftest import Kubectl

ROOT: Final = Path(__file__).resolve().parents[2]
RBAC: Final = ROOT / "deploy" / "rbac" / "cluster-wide.yaml"
OPERATOR_NAMESPACE: Final = "inferfleet-system"
LEADER_ACCOUNT: Final = "inferfleet-operator"
# A second identity with the same grants, so that the audit log tells the two processes apart.
STANDBY_ACCOUNT: Final = "inferfleet-operator-standby"
MD: Final = "qwen"
# ElectionTiming's defaults: a released lease is taken at the follower's next (jittered) try.
RETRY_S: Final = 2.0 * 1.2


class Candidate:
    """`inferfleet run --leader-elect` as a child process, serving its liveness probe on a
    loopback port."""

    def __init__(self, name: str, kubeconfig: Path, directory: Path, election_id: str) -> None:
        self.name = name
        self.log = directory / f"{name}.log"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.health_port = probe.getsockname()[1]
        self.kubeconfig = kubeconfig
        self.election_id = election_id
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, namespace: str) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "inferfleet.cli", "run", "--namespace", namespace,
                 "--leader-elect", "--leader-election-namespace", OPERATOR_NAMESPACE,
                 "--leader-election-id", self.election_id,
                 "--liveness", f"http://127.0.0.1:{self.health_port}/healthz",
                 "--prometheus-url", "http://127.0.0.1:9", "--metrics-port", "0"],
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig), "POD_NAME": self.name},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def signal(self, sig: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    def exit_code(self, timeout_s: float = 30) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def health(self) -> httpx.Response | None:
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2)
        except httpx.HTTPError:
            return None

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def _kubeconfig(kubectl: Kubectl, cluster: DevCluster, account: str, path: Path) -> Path:
    token = kubectl.run(
        "create", "token", account, "-n", OPERATOR_NAMESPACE, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig_path.read_text())
    admin["users"] = [{"name": admin["users"][0]["name"], "user": {"token": token}}]
    path.write_text(yaml.safe_dump(admin))
    return path


@pytest.fixture
def accounts(kubectl: Kubectl, cluster: DevCluster, tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Kubeconfigs of the operator's account and of a standby one bound to the same roles."""
    kubectl.run("create", "namespace", OPERATOR_NAMESPACE, check=False)
    kubectl.run("apply", "--server-side", "-f", str(RBAC))
    standby = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{STANDBY_ACCOUNT}"
    bindings = {
        "ClusterRoleBinding": {"roleRef": "ClusterRole", "role": LEADER_ACCOUNT},
        "RoleBinding": {"roleRef": "Role", "role": f"{LEADER_ACCOUNT}-leader-election"},
    }
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": STANDBY_ACCOUNT, "namespace": OPERATOR_NAMESPACE}},
    ]  # fmt: skip
    subject = {"kind": "ServiceAccount", "name": STANDBY_ACCOUNT, "namespace": OPERATOR_NAMESPACE}
    for kind, ref in bindings.items():
        metadata = {"name": STANDBY_ACCOUNT} | (
            {"namespace": OPERATOR_NAMESPACE} if kind == "RoleBinding" else {}
        )
        role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": ref["roleRef"]}
        objects.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": kind,
                "metadata": metadata,
                "roleRef": role_ref | {"name": ref["role"]},
                "subjects": [subject],
            }
        )
    manifest = yaml.safe_dump_all(objects)
    kubectl.run("apply", "--server-side", "-f", "-", stdin=manifest)
    answer = kubectl.run(
        "auth", "can-i", "update", "leases.coordination.k8s.io", "-n", OPERATOR_NAMESPACE,
        f"--as={standby}",
    )  # fmt: skip
    assert answer.stdout.strip() == "yes"
    yield {
        "leader": _kubeconfig(kubectl, cluster, LEADER_ACCOUNT, tmp_path / "leader.kubeconfig"),
        "standby": _kubeconfig(kubectl, cluster, STANDBY_ACCOUNT, tmp_path / "standby.kubeconfig"),
    }
    kubectl.run("delete", "-f", "-", "--ignore-not-found", stdin=manifest)


def _lease(kubectl: Kubectl, name: str) -> dict[str, Any]:
    result = kubectl.run("get", "lease", name, "-n", OPERATOR_NAMESPACE, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def _holder(kubectl: Kubectl, name: str) -> str:
    return str(_lease(kubectl, name).get("spec", {}).get("holderIdentity", ""))


def _writes_by(audit_log: Path, account: str, namespace: str) -> list[str]:
    """The account's writes to the test's namespace (the Lease's are not audited)."""
    user = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"
    writes = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        uri = event.get("requestURI", "")
        if event.get("user", {}).get("username") == user and f"/namespaces/{namespace}/" in uri:
            writes.append(f"{event['verb']} {uri}")
    return writes


def _model_deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": MD},
        "spec": {
            "model": {"name": "qwen2.5-7b", "source": "hf://Qwen/Qwen2.5-7B-Instruct"},
            "engine": {"name": "sim"},
            "gpu": {"type": "H100-80GB"},
            "batching": {"maxModelLength": 8192},
            "replicas": replicas,
        },
    }


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for found in obj.get("status", {}).get("conditions", []):
        if found["type"] == type_:
            return dict(found)
    return {}


def _converged(kubectl: Kubectl, namespace: str, replicas: int) -> bool:
    md = kubectl.json("get", "modeldeployment", MD, "-n", namespace)
    deployments = kubectl.json(
        "get", "deployments", "-n", namespace, "-l", f"inferfleet.io/model-deployment={MD}"
    )["items"]
    return (
        _condition(md, "Ready").get("status") == "True"
        and md["status"].get("observedGeneration") == md["metadata"]["generation"]
        and len(deployments) == 1
        and deployments[0]["spec"]["replicas"] == replicas
        and deployments[0]["status"].get("readyReplicas") == replicas
    )


def _events(kubectl: Kubectl, namespace: str) -> Counter[tuple[str, str]]:
    """Every posting of an Event about the ModelDeployment, by reason and message (a repeated
    posting is either another Event object or a higher count on one)."""
    events = kubectl.json("get", "events", "-n", namespace)["items"]
    counts: Counter[tuple[str, str]] = Counter()
    for event in events:
        involved = event.get("involvedObject", {})
        if involved.get("kind") == "ModelDeployment" and involved.get("name") == MD:
            counts[event["reason"], event.get("message", "")] += int(event.get("count") or 1)
    return counts


@pytest.mark.timeout(240)
def test_one_leader_acts_and_a_follower_takes_over_within_15_s(
    kubectl: Kubectl,
    cluster: DevCluster,
    namespace: str,
    accounts: dict[str, Path],
    tmp_path: Path,
) -> None:
    election_id = f"inferfleet-{namespace}"[:63]
    leader = Candidate("operator-a", accounts["leader"], tmp_path, election_id)
    standby = Candidate("operator-b", accounts["standby"], tmp_path, election_id)
    third = Candidate("operator-c", accounts["leader"], tmp_path, election_id)
    candidates = (leader, standby, third)
    try:
        # The first candidate creates the Lease and leads; the second follows and stays alive.
        leader.start(namespace)
        assert wait_until(
            lambda: _holder(kubectl, election_id).startswith("operator-a_"), 30, 0.2
        ), leader.tail()
        standby.start(namespace)
        assert wait_until(lambda: "operator-a_" in standby.log.read_text(), 30, 0.2), standby.tail()
        answer = standby.health()
        assert answer is not None
        assert answer.status_code == 200
        assert answer.json()["leading"] is False
        assert answer.json()["leader"].startswith("operator-a_")

        # A rollout, interrupted: the leader rolls the ModelDeployment out, then is SIGKILLed
        # the moment its spec changes (two replicas instead of one), often before that rollout
        # is done (when not, the change after the takeover is the new leader's alone).
        kubectl.run(
            "apply", "--server-side", "-n", namespace, "-f", "-",
            stdin=yaml.safe_dump(_model_deployment(replicas=1)),
        )  # fmt: skip
        assert wait_until(lambda: _converged(kubectl, namespace, 1), 60, 0.2), leader.tail()
        kubectl.run(
            "patch", "modeldeployment", MD, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"replicas": 2}}),
        )  # fmt: skip
        leader.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        converged_at_kill = _converged(kubectl, namespace, 2)
        transitions = _lease(kubectl, election_id)["spec"].get("leaseTransitions", 0)
        audit_log = cluster.log_dir / "audit.log"
        # Only the leader acted: the follower's account wrote nothing at all to the namespace.
        assert _writes_by(audit_log, LEADER_ACCOUNT, namespace)
        assert _writes_by(audit_log, STANDBY_ACCOUNT, namespace) == []

        assert wait_until(
            lambda: _holder(kubectl, election_id).startswith("operator-b_"), 20, 0.1
        ), standby.tail()
        took_over_s = time.monotonic() - killed_at
        print(f"takeover after SIGKILL: {took_over_s:.1f} s")
        assert took_over_s < 15.0
        assert _lease(kubectl, election_id)["spec"]["leaseTransitions"] == transitions + 1

        # The new leader finishes the rollout (where the old one had not), and carries out
        # what changes after; no Event is posted twice.
        assert wait_until(lambda: _converged(kubectl, namespace, 2), 60, 0.5), standby.tail()
        print(f"converged when the leader was killed: {converged_at_kill}")
        kubectl.run(
            "patch", "modeldeployment", MD, "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"replicas": 3}}),
        )  # fmt: skip
        assert wait_until(lambda: _converged(kubectl, namespace, 3), 60, 0.5), standby.tail()
        assert _writes_by(audit_log, STANDBY_ACCOUNT, namespace)
        # The liveness endpoint is kopf's now, on the same address the follower served.
        answer = standby.health()
        assert answer is not None
        assert answer.status_code == 200
        assert "leading" not in answer.json()
        events = _events(kubectl, namespace)
        print(f"events: {dict(events)}")
        # Each generation's rollout reported once: none lost, none posted twice.
        applied = sorted(message for reason, message in events if reason == "Applied")
        generations = [m.split(":")[0] for m in applied]
        assert generations == ["generation 1", "generation 2", "generation 3"], events
        assert {event: n for event, n in events.items() if n > 1} == {}

        # SIGTERM: the leader releases the Lease as it stops, and a follower takes it at its
        # next try instead of waiting out the lease.
        third.start(namespace)
        assert wait_until(lambda: "operator-b_" in third.log.read_text(), 30, 0.2), third.tail()
        standby.signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert wait_until(
            lambda: _holder(kubectl, election_id).startswith("operator-c_"), 15, 0.1
        ), third.tail()
        handed_over_s = time.monotonic() - stopped_at
        print(f"handover after SIGTERM: {handed_over_s:.1f} s")
        assert handed_over_s < RETRY_S + 2.0
        assert standby.exit_code() == 0, standby.tail()
        assert "released the lease" in standby.log.read_text()

        # A leader whose Lease is taken from it stops acting and exits non-zero, for the
        # kubelet to restart it as a follower.
        lease = _lease(kubectl, election_id)
        lease["spec"]["holderIdentity"] = "intruder"
        kubectl.run("replace", "-f", "-", stdin=json.dumps(lease))
        taken_at = time.monotonic()
        assert third.exit_code(timeout_s=15) == 1, third.tail()
        assert time.monotonic() - taken_at < 7.0
        assert "leadership lost" in third.log.read_text()
        assert _holder(kubectl, election_id) == "intruder"
        assert _converged(kubectl, namespace, 3)
    finally:
        for candidate in candidates:
            candidate.stop()
        kubectl.run("delete", "lease", election_id, "-n", OPERATOR_NAMESPACE, check=False)
