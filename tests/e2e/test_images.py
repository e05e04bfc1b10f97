"""The images run: the fleet in its OCI runtime mode starts inferfleet's own pods from the
images tools/images/build.sh builds, through crun. The operator runs as a pod of its image
with its ServiceAccount's projected token (in-cluster configuration), reconciles the `sim`
example into a router and a sim engine that run from their images too; the InferenceService
turns Ready and a request is served through its router. Each of the three is a container of
crun: in pid, mount, ipc and uts namespaces of its own, on the host's network (its pod IP),
as its user, without capabilities, the operator's root read-only."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import OPERATOR_IMAGE, DevCluster, Runtime, running
from inferfleet.devcluster.images import ensure_images
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from inferfleet.render.inference_service import ROUTER_REPLICAS
from inferfleet.render.rbac import DEFAULT_NAMESPACE as OPERATOR_NAMESPACE
from inferfleet.router.config import ADMIN_PORT
from tests.e2e.conftest import Kubectl
from tests.e2e.test_local_fleet import stream_completion

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-3.1-8b-aggregated-sim.yaml"
NAMESPACE = "images"
MODEL = "llama-3.1-8b"
ENGINES = "inferfleet.io/model-deployment=llama-3-1-8b"
ROUTERS = "inferfleet.io/inference-service=chat"
OPERATOR = "app.kubernetes.io/name=inferfleet-operator"
PORT = 8000
IMAGE_USER = 65532
# The first run builds the images (minutes) and unpacks each once.
pytestmark = pytest.mark.timeout(900)


@dataclass(frozen=True)
class Fleet:
    cluster: DevCluster
    kubectl: Kubectl

    def pod(self, namespace: str, selector: str) -> dict[str, Any]:
        pods = [
            p
            for p in self.kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        found: dict[str, Any] = pods[0]
        return found

    def containers(self) -> dict[str, int]:
        """crun's running containers, by id: their pids on this machine."""
        listed = subprocess.run(
            ["crun", "--root", str(self.cluster.state_dir / "crun"), "list", "--format", "json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return {c["id"]: int(c["pid"]) for c in json.loads(listed.stdout or "[]")}

    def container_pid(self, pod: dict[str, Any]) -> int:
        metadata = pod["metadata"]
        name = f"{metadata['namespace']}.{metadata['name']}.{metadata['uid'][:8]}"
        containers = self.containers()
        assert name in containers, (name, sorted(containers))
        return containers[name]

    def diagnostics(self) -> str:
        logs = self.cluster.log_dir
        parts = [("fleet-agent", logs / "fleet-agent.log")]
        parts += [(p.name, p) for p in sorted((logs / "pods").glob("*.log"))]
        return "\n".join(
            f"--- {name}\n{path.read_text(errors='replace')[-3000:]}"
            for name, path in parts
            if path.exists()
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    bin_dir = ensure_binaries()
    images = ensure_images()  # tools/images/build.sh: cached after the first build
    pools = NodePool.parse("H100-80GB=1")
    with running(
        tmp_path_factory.mktemp("images"),
        bin_dir,
        pools,
        timeout_s=180.0,
        with_fleet=True,
        runtime=Runtime.OCI,
        images=images,
    ) as cluster:
        kubectl = Kubectl(bin_dir / "kube", cluster.kubeconfig_path)
        kubectl.run("create", "namespace", NAMESPACE)
        kubectl.run("apply", "--server-side", "-n", NAMESPACE, "-f", str(EXAMPLE))
        yield Fleet(cluster, kubectl)


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == kind:
            found: dict[str, Any] = condition
            return found
    return {}


def _healthy(ip: str) -> bool:
    try:
        return httpx.get(f"http://{ip}:{PORT}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _status_ids(pid: int) -> tuple[int, int, str]:
    """A process's real uid and gid, and its effective capabilities."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]), fields["CapEff"].strip()


def _namespace(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _root_mount_options(pid: int) -> list[str]:
    """The mount options of the process's `/`, as the kernel enforces them."""
    root: list[str] = []
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            root = fields[5].split(",")  # the last one mounted there is the one in effect
    return root


def test_the_operator_router_and_engine_run_from_their_images_and_serve(fleet: Fleet) -> None:
    # The operator: a pod of its image, Ready (start_fleet waited for it), acting in-cluster.
    operator = fleet.pod(OPERATOR_NAMESPACE, OPERATOR)
    assert operator["spec"]["containers"][0]["image"] == OPERATOR_IMAGE

    # It reconciles the example: the service turns Ready, its pods run from their images.
    def service() -> dict[str, Any]:
        found: dict[str, Any] = fleet.kubectl.json("get", "infsvc", "chat", "-n", NAMESPACE)
        return found

    assert wait_until(lambda: _condition(service(), "Ready").get("status") == "True", 180, 1.0), (
        service().get("status"),
        fleet.diagnostics(),
    )
    engine = fleet.pod(NAMESPACE, ENGINES)
    assert engine["spec"]["containers"][0]["image"].startswith("inferfleet/sim-engine:")
    routers = [
        p
        for p in fleet.kubectl.json("get", "pods", "-n", NAMESPACE, "-l", ROUTERS)["items"]
        if p["status"].get("phase") == "Running" and p["status"].get("podIP")
    ]
    router_ips = sorted(p["status"]["podIP"] for p in routers)
    assert router_ips
    for ip in router_ips:
        assert wait_until(lambda ip=ip: _healthy(ip), 60, 0.5), fleet.diagnostics()  # type: ignore[misc]

    # A request served through a router, by the engine behind it.
    pieces = stream_completion(router_ips[0])
    assert len(pieces) >= 8, pieces

    # Each is a container of crun, isolated but on the host's network (its pod IP).
    for pod in (operator, routers[0], engine):
        pid = fleet.container_pid(pod)
        assert _namespace(pid, "net") == _namespace("self", "net")
        for kind in ("pid", "mnt", "ipc", "uts"):
            assert _namespace(pid, kind) != _namespace("self", kind), (
                pod["metadata"]["name"],
                kind,
            )
        uid, gid, capabilities = _status_ids(pid)
        security = pod["spec"].get("securityContext") or {}
        # The pod's runAsUser where it sets one (rendered pods do), else the image's user.
        assert uid == security.get("runAsUser", IMAGE_USER), pod["metadata"]["name"]
        assert gid == security.get("runAsGroup", IMAGE_USER), pod["metadata"]["name"]
        assert int(capabilities, 16) == 0
    # The operator's and the router's roots are read-only (readOnlyRootFilesystem, as
    # rendered); the engine's is its own layer.
    assert "ro" in _root_mount_options(fleet.container_pid(operator))
    assert "ro" in _root_mount_options(fleet.container_pid(routers[0]))
    assert "rw" in _root_mount_options(fleet.container_pid(engine))
    # In-cluster identity: the projected token, CA and namespace where clients look for them.
    pid = fleet.container_pid(operator)
    account = Path(f"/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount")
    assert (account / "namespace").read_text() == OPERATOR_NAMESPACE
    assert "BEGIN CERTIFICATE" in (account / "ca.crt").read_text()
    assert (account / "token").read_text().count(".") == 2
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
        if "=" in item
    )
    assert environ["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert "KUBECONFIG" not in environ


def test_a_write_to_the_read_only_root_fails(fleet: Fleet) -> None:
    operator = fleet.pod(OPERATOR_NAMESPACE, OPERATOR)
    pid = fleet.container_pid(operator)
    # Inside the operator's mount namespace, as its user, with the image's own interpreter.
    attempt = subprocess.run(
        ["nsenter", "--target", str(pid), "--mount", "--setuid", str(IMAGE_USER),
         "--setgid", str(IMAGE_USER), "/usr/bin/python3.11", "-c", "open('/written', 'w')"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert attempt.returncode != 0
    assert "Read-only file system" in attempt.stderr, attempt.stderr
    # /tmp, its emptyDir, takes writes.
    scratch = subprocess.run(
        ["nsenter", "--target", str(pid), "--mount", "--setuid", str(IMAGE_USER),
         "--setgid", str(IMAGE_USER), "/usr/bin/python3.11", "-c", "open('/tmp/written', 'w')"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    assert scratch.returncode == 0, scratch.stderr


def test_a_deleted_pod_ends_its_container(fleet: Fleet) -> None:
    engine = fleet.pod(NAMESPACE, ENGINES)
    pid = fleet.container_pid(engine)
    fleet.kubectl.run("delete", "pod", engine["metadata"]["name"], "-n", NAMESPACE, "--wait=false")
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 90, 0.5), fleet.diagnostics()
    uid = engine["metadata"]["uid"][:8]
    assert not [c for c in fleet.containers() if c.endswith(uid)]


def _routers_with_tenants(fleet: Fleet, namespace: str) -> list[str]:
    """The pod IPs of the service's routers once every one running has its tenants' flags
    (the rollout that added them is over) and answers its health check; [] until then."""
    pods = [
        p
        for p in fleet.kubectl.json("get", "pods", "-n", namespace, "-l", ROUTERS)["items"]
        if not p["metadata"].get("deletionTimestamp")
    ]
    if not pods or any(
        p["status"].get("phase") != "Running"
        or not p["status"].get("podIP")
        or "--tenant" not in p["spec"]["containers"][0]["args"]
        for p in pods
    ):
        return []
    ips = sorted(p["status"]["podIP"] for p in pods)
    return ips if all(_healthy(ip) for ip in ips) else []


def _post_completion(ip: str, key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(
        f"http://{ip}:{PORT}/v1/completions",
        json={"model": MODEL, "prompt": "hello", "max_tokens": 2},
        headers=headers,
        timeout=30.0,
    )


def _complete(ip: str, key: str | None) -> int:
    return _post_completion(ip, key).status_code


def test_a_tenants_key_opens_its_own_service_and_no_other(fleet: Fleet) -> None:
    """Two namespaces, a service each, a tenant each with a key in a Secret: the router
    (from its image, in crun) reads the keys from the Secret mounted as the renderer mounts
    it, as the router's user; a key opens its own service only."""
    other = "images-tenant-b"
    fleet.kubectl.run("create", "namespace", other)
    fleet.kubectl.run("apply", "--server-side", "-n", other, "-f", str(EXAMPLE))
    keys = {NAMESPACE: "key-of-team-a", other: "key-of-team-b"}
    for namespace, tenant in ((NAMESPACE, "team-a"), (other, "team-b")):
        fleet.kubectl.run(
            "create", "secret", "generic", "chat-keys", "-n", namespace,
            f"--from-literal=current={keys[namespace]}",
        )  # fmt: skip
        tenants = [{"name": tenant, "apiKeySecret": "chat-keys"}]
        fleet.kubectl.run(
            "patch", "infsvc", "chat", "-n", namespace, "--type=merge",
            "-p", json.dumps({"spec": {"tenants": tenants}}),
        )  # fmt: skip
    routers: dict[str, list[str]] = {}
    for namespace in (NAMESPACE, other):

        def rolled_out(namespace: str = namespace) -> bool:
            routers[namespace] = _routers_with_tenants(fleet, namespace)
            return bool(routers[namespace])

        assert wait_until(rolled_out, 240, 1.0), fleet.diagnostics()
    own_a, own_b = routers[NAMESPACE][0], routers[other][0]
    assert _complete(own_a, None) == 401
    assert _complete(own_a, keys[other]) == 401
    assert _complete(own_b, keys[NAMESPACE]) == 401
    for ip in routers[NAMESPACE]:
        assert _complete(ip, keys[NAMESPACE]) == 200
    for ip in routers[other]:
        assert _complete(ip, keys[other]) == 200


def test_engines_with_an_api_key_answer_their_router_and_no_one_else(fleet: Fleet) -> None:
    """A ModelDeployment with `engine.apiKeySecret`: its engine (from its image) takes the key
    from the Secret by its environment, as the kubelet passes it; the router reads it from the
    Secret mounted as the renderer mounts it and presents it. A call straight to the engine,
    past the router, is refused. The key rotates with no router restarted and no call through
    a router refused, the engine restarted to take the new one."""
    namespace = "images-engine-key"
    fleet.kubectl.run("create", "namespace", namespace)
    fleet.kubectl.run(
        "create", "secret", "generic", "llama-engine-key", "-n", namespace,
        "--from-literal=api-key=only-routers-know-this",
    )  # fmt: skip
    documents = list(yaml.safe_load_all(EXAMPLE.read_text()))
    for document in documents:
        if document["kind"] == "ModelDeployment":
            document["spec"]["engine"]["apiKeySecret"] = "llama-engine-key"
    fleet.kubectl.run(
        "apply", "--server-side", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(documents)
    )

    routers: list[dict[str, Any]] = []

    def serving() -> bool:
        """Every router Ready, as the agent probes it, and answering through the engine."""
        found = fleet.kubectl.json("get", "pods", "-n", namespace, "-l", ROUTERS)["items"]
        routers[:] = [
            p
            for p in found
            if p["status"].get("podIP")
            and _condition(p, "Ready").get("status") == "True"
            and not p["metadata"].get("deletionTimestamp")
        ]
        try:
            return len(routers) == ROUTER_REPLICAS and all(
                _complete(p["status"]["podIP"], None) == 200 for p in routers
            )
        except httpx.HTTPError:
            return False

    assert wait_until(serving, 240, 1.0), fleet.diagnostics()
    engine_ip = _serving_engine(fleet, namespace)
    assert _complete(engine_ip, None) == 401
    assert _complete(engine_ip, "a-guess") == 401
    assert _complete(engine_ip, "only-routers-know-this") == 200  # the key is the engine's
    assert httpx.get(f"http://{engine_ip}:{PORT}/health", timeout=10.0).status_code == 200
    _rotate_engine_key(fleet, namespace, [p["status"]["podIP"] for p in routers])


def _serving_engine(fleet: Fleet, namespace: str) -> str:
    """The IP of the one engine pod once it is Ready and answers its health check: a call
    through a router that was answered says an engine served it, not that the pod found by
    phase `Running` (the container started) is listening now."""
    found: list[str] = []

    def serving() -> bool:
        try:
            pod = fleet.pod(namespace, ENGINES)
        except AssertionError:  # two, while one terminates
            return False
        ip = pod["status"].get("podIP")
        if not ip or _condition(pod, "Ready").get("status") != "True" or not _healthy(ip):
            return False
        found[:] = [ip]
        return True

    assert wait_until(serving, 120, 1.0), fleet.diagnostics()
    return found[0]


def _answer(ip: str) -> tuple[int, str]:
    """A call through a router while engines roll out: its status and, where it failed, the
    error's message (status 0 and the exception where the call broke)."""
    try:
        answer = _post_completion(ip, None)
    except httpx.HTTPError as error:
        return 0, f"{type(error).__name__}: {error}"
    if answer.status_code == 200:
        return 200, ""
    try:
        return answer.status_code, str(answer.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return answer.status_code, answer.text[:200]


def _refused_for_its_key(answers: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Calls refused for the engine key: a 401, or a 502 whose message says the engines refused
    the router's keys (a 502 for a broken call or a 503 says nothing of the key)."""
    return [(status, why) for status, why in answers if status == 401 or "engine key" in why]


def _restarts(fleet: Fleet, namespace: str, selector: str) -> dict[str, int]:
    """Per pod of the selector, its containers' restarts."""
    pods = fleet.kubectl.json("get", "pods", "-n", namespace, "-l", selector)["items"]
    return {
        p["metadata"]["name"]: sum(
            c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])
        )
        for p in pods
    }


def _refused_keys(router_ip: str) -> float:
    """The calls whose engine key an engine refused, as the router counts them."""
    text = httpx.get(f"http://{router_ip}:{ADMIN_PORT}/metrics", timeout=10.0).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "inferfleet_router_upstream_errors_total"
        and sample.labels.get("kind") == "key"
    )


def _rotate_engine_key(fleet: Fleet, namespace: str, router_ips: list[str]) -> None:
    old_engine = fleet.pod(namespace, ENGINES)["metadata"]["name"]
    before = _restarts(fleet, namespace, ROUTERS) | _restarts(fleet, namespace, ENGINES)
    fleet.kubectl.run(
        "patch", "secret", "llama-engine-key", "-n", namespace, "--type=merge",
        "-p", json.dumps({"stringData": {"api-key": "rotated"}}),
    )  # fmt: skip
    mounted = [
        path
        for path in (fleet.cluster.state_dir / "pods").glob(f"{namespace}_*/volumes/*/api-key")
        if "engine-key" in path.parent.name
    ]
    assert mounted, "no router mounts the engine key"
    answers: list[tuple[int, str]] = []

    def routers_read_the_new_key() -> bool:
        answers.extend(_answer(ip) for ip in router_ips)
        return all(path.read_text() == "rotated" for path in mounted)

    # The agent writes the Secret again as a kubelet does; the routers read it within 10 s.
    assert wait_until(routers_read_the_new_key, 60, 1.0), fleet.diagnostics()
    for _ in range(12):  # past the routers' reload
        answers.extend(_answer(ip) for ip in router_ips)
        time.sleep(1.0)
    # The engine still takes only the old key; the routers present it when the new is refused:
    # no call is refused for its key (401, or 502 saying the engines refused the router's keys),
    # and nothing restarted to make it so: not the routers, not the engine.
    assert not _refused_for_its_key(answers), (answers, fleet.diagnostics())
    assert (200, "") in answers, answers
    after = _restarts(fleet, namespace, ROUTERS) | _restarts(fleet, namespace, ENGINES)
    assert after == before, (before, after)
    print(f"\nthrough the key's rotation: {Counter(status for status, _ in answers)}")
    assert all(_refused_keys(ip) > 0 for ip in router_ips)
    engine_ip = _serving_engine(fleet, namespace)
    assert _complete(engine_ip, "rotated") == 401
    fleet.kubectl.run(
        "rollout", "restart", "deployment/llama-3-1-8b-aggregated", "-n", namespace
    )  # fmt: skip

    def restarted() -> bool:
        answers.extend(_answer(ip) for ip in router_ips)
        try:
            engine = fleet.pod(namespace, ENGINES)
        except AssertionError:  # two, while the old one terminates
            return False
        return engine["metadata"]["name"] != old_engine and bool(engine["status"].get("podIP"))

    assert wait_until(restarted, 240, 1.0), fleet.diagnostics()
    engine_ip = fleet.pod(namespace, ENGINES)["status"]["podIP"]

    def takes_the_new_key() -> bool:
        try:
            return _complete(engine_ip, "rotated") == 200
        except httpx.HTTPError:  # not listening yet
            return False

    assert wait_until(takes_the_new_key, 120, 1.0), fleet.diagnostics()
    assert _complete(engine_ip, "only-routers-know-this") == 401

    def routers_serve() -> bool:
        statuses = [_answer(ip) for ip in router_ips]
        answers.extend(statuses)
        return {status for status, _ in statuses} == {200}

    # Once the routers have found the new engine (its EndpointSlice updated).
    assert wait_until(routers_serve, 60, 1.0), fleet.diagnostics()
    # Through the rollout, no call through a router was refused for its key.
    assert not _refused_for_its_key(answers), answers
