"""The local fleet's pure parts: what the fleet agent runs for a pod, how routers find Ready
pods, what the operator renders for pod discovery, and Prometheus' pod discovery job."""

from __future__ import annotations

import base64
import copy
import dataclasses
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferfleet.devcluster.cluster import State
from inferfleet.devcluster.components import fleet_pod_stages
from inferfleet.devcluster.fleet import AgentContext, FleetAgent, PodSupervisor
from inferfleet.devcluster.oci import (
    Bundle,
    ConfigMapKey,
    FieldValue,
    Identity,
    Image,
    ImageConfig,
    ImageError,
    MountPoint,
    SecretKeys,
    Token,
    Volume,
    command_line,
    container_launch,
    crun_argv,
    identity,
    layout_name,
    manifest_for,
    pod_volumes,
    runtime_config,
    split_reference,
)
from inferfleet.devcluster.pod_process import (
    Kind,
    Probe,
    listen_on,
    oci_pod_process,
    pod_process,
    readiness_probe,
    readiness_status,
    restarts_after,
    service_account_kubeconfig,
    terminated_status,
)
from inferfleet.devcluster.podspec import container_env, expand_references
from inferfleet.devcluster.prometheus import (
    config_text,
    kubernetes_pods_job,
    pod_discovery_rbac,
)
from inferfleet.render import render_inference_service, render_model_deployment
from inferfleet.router.config import DiscoveryMode, parse_backend
from inferfleet.router.discovery import (
    PodWatcher,
    pod_is_ready,
    ready_pod_urls,
    selects,
    service_selector,
)
from tests.unit.golden.specs import example_objects

SIM_EXAMPLE = "llama-3.1-8b-aggregated-sim.yaml"
EXECUTABLE = "/venv/bin/inferfleet"

Wire = dict[str, Any]


def rendered(discovery: DiscoveryMode = DiscoveryMode.PODS) -> list[Wire]:
    md, isvc = example_objects(SIM_EXAMPLE, namespace="fleet")
    objects = render_model_deployment(md)
    return objects + render_inference_service(
        isvc, {str(md.metadata["name"]): md}, router_discovery=discovery
    )


def pod_of(deployment: Wire, name: str, ip: str | None = "127.1.0.7", **status: Any) -> Wire:
    """A pod as the ReplicaSet controller creates it and kwok runs it."""
    template = copy.deepcopy(deployment["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"]
        | {"name": name, "namespace": "fleet", "uid": f"uid-{name}"},
        "spec": template["spec"] | {"nodeName": "gpu-h100-80gb-0"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        | ({"podIP": ip} if ip else {})
        | status,
    }


def deployment_of(objects: list[Wire], component: str) -> Wire:
    (found,) = [
        o
        for o in objects
        if o["kind"] == "Deployment"
        and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    ]
    return found


@pytest.mark.parametrize(
    ("text", "env", "want", "reason"),
    [
        ("$(POD_NAMESPACE)", {"POD_NAMESPACE": "fleet"}, "fleet", "a defined variable"),
        ("--ns=$(POD_NAMESPACE)/x", {"POD_NAMESPACE": "a"}, "--ns=a/x", "inside a word"),
        ("$(MISSING)", {}, "$(MISSING)", "undefined references stay as written"),
        ("$$(POD_NAMESPACE)", {"POD_NAMESPACE": "a"}, "$(POD_NAMESPACE)", "$$ escapes"),
        ("$POD_NAMESPACE", {"POD_NAMESPACE": "a"}, "$POD_NAMESPACE", "only $(...) expands"),
    ],
)
def test_references_expand_as_kubernetes_does(
    text: str, env: dict[str, str], want: str, reason: str
) -> None:
    assert expand_references(text, env) == want, reason


def test_env_resolves_values_and_field_refs() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}},
        "status": {"podIP": "127.1.0.3"},
    }
    container = {
        "env": [
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a']"}}},
            {"name": "URL", "value": "http://$(IP):8000"},
        ]
    }
    assert container_env(pod, container) == {
        "POD_NAMESPACE": "ns",
        "IP": "127.1.0.3",
        "LABEL": "b",
        "URL": "http://127.1.0.3:8000",
    }
    secret_env = {
        "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "api-key"}}}]
    }
    # Without Secrets to read (the venv mode), refused with the variable's name; with them (the
    # image mode's kubelet), the Secret's value.
    with pytest.raises(ValueError, match="KEY"):
        container_env(pod, secret_env)
    values = {("s", "api-key"): "sesame"}
    assert container_env(pod, secret_env, lambda name, key: values[name, key]) == {"KEY": "sesame"}


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--port", "8000"], ["--port", "8000", "--host", "127.1.0.9"]),
        (["--host", "0.0.0.0", "--port", "8000"], ["--port", "8000", "--host", "127.1.0.9"]),
        (["--host=::", "--port", "1"], ["--port", "1", "--host", "127.1.0.9"]),
    ],
)
def test_the_pod_ip_replaces_the_wildcard_listen_address(args: list[str], want: list[str]) -> None:
    assert listen_on(args, "127.1.0.9") == want


def test_readiness_probe_resolves_the_named_port() -> None:
    container = {
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
    }
    assert readiness_probe(container) == Probe("/health", 8000)
    assert readiness_probe({"readinessProbe": {"httpGet": {"port": 9000}}}) == Probe("/", 9000)
    assert readiness_probe({}) is None
    # Its timeout and failure threshold, as a kubelet applies them (its defaults: 1 s, 3).
    timed = {"readinessProbe": {"httpGet": {"port": 9000}, "timeoutSeconds": 5,
                                "failureThreshold": 4}}  # fmt: skip
    assert readiness_probe(timed) == Probe("/", 9000, timeout_s=5.0, failure_threshold=4)
    assert readiness_probe({"readinessProbe": {"httpGet": {"port": 9000}}}) == Probe(
        "/", 9000, timeout_s=1.0, failure_threshold=3
    )


def test_an_engine_pod_runs_the_sim_engine_on_its_ip() -> None:
    engine = deployment_of(rendered(), "aggregated")
    process = pod_process(pod_of(engine, "llama-0"), EXECUTABLE)
    assert process is not None
    assert process.kind == Kind.ENGINE
    assert process.argv[:2] == (EXECUTABLE, "sim-engine")
    assert process.argv[-2:] == ("--host", "127.1.0.7")
    assert "--port" in process.argv
    assert process.service_account is None
    # The rendered engine probe: 5 s to answer, three failures in a row to leave the Service.
    assert process.readiness == Probe("/health", 8000, timeout_s=5.0, failure_threshold=3)
    assert process.key == "fleet_llama-0"
    assert process.container == "engine"
    # Its preStop sleep, run by the agent before SIGTERM; the grace covers it and the drain.
    assert (process.pre_stop_s, process.grace_s) == (5.0, 60.0)


def test_a_router_pod_runs_with_its_namespace_its_name_and_service_account() -> None:
    router = deployment_of(rendered(), "router")
    process = pod_process(pod_of(router, "chat-router-0", ip="127.1.0.8"), EXECUTABLE)
    assert process is not None
    assert process.kind == Kind.ROUTER
    args = list(process.argv)
    assert args[args.index("--namespace") + 1] == "fleet"
    assert args[args.index("--discovery") + 1] == "pods"
    assert process.env == {"POD_NAMESPACE": "fleet", "POD_NAME": "chat-router-0"}
    assert process.service_account == "chat-router"
    assert process.grace_s == 60


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"ip": None}, "no address yet"),
        ({"phase": "Pending"}, "not Running"),
        ({"deleting": True}, "being deleted"),
        ({"command": ["vllm", "serve"]}, "not an inferfleet command"),
        ({"command": ["inferfleet", "run"]}, "an inferfleet command the agent does not run"),
    ],
)
def test_pods_without_a_process(change: dict[str, Any], reason: str) -> None:
    engine = deployment_of(rendered(), "aggregated")
    pod = pod_of(engine, "p", ip=change.get("ip", "127.1.0.7"))
    if "phase" in change:
        pod["status"]["phase"] = change["phase"]
    if change.get("deleting"):
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if "command" in change:
        pod["spec"]["containers"][0]["command"] = change["command"]
    assert pod_process(pod, EXECUTABLE) is None, reason


def test_a_new_ip_is_a_new_process() -> None:
    engine = deployment_of(rendered(), "aggregated")
    first = pod_process(pod_of(engine, "p", ip="127.1.0.7"), EXECUTABLE)
    assert first == pod_process(pod_of(engine, "p", ip="127.1.0.7"), EXECUTABLE)
    assert first != pod_process(pod_of(engine, "p", ip="127.1.0.8"), EXECUTABLE)


def test_readiness_is_written_as_a_kubelet_writes_it() -> None:
    now = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
    status = readiness_status("engine", False, "ProbeFailed", 2, now)
    assert [c["type"] for c in status["conditions"]] == ["Ready", "ContainersReady"]
    assert status["containerStatuses"] == [{"name": "engine", "ready": False, "restartCount": 2}]
    assert all(
        c["status"] == "False" and c["reason"] == "ProbeFailed" for c in status["conditions"]
    )
    assert status["conditions"][0]["lastTransitionTime"] == "2026-11-22T03:00:00Z"
    assert all(
        "reason" not in c for c in readiness_status("engine", True, "x", 0, now)["conditions"]
    )


def test_a_router_kubeconfig_reads_its_token_from_a_file() -> None:
    config = service_account_kubeconfig("https://127.0.0.1:6443", Path("/ca.crt"), Path("/t"))
    assert config["users"][0]["user"] == {"tokenFile": "/t"}
    assert config["clusters"][0]["cluster"]["certificate-authority"] == "/ca.crt"


# Router discovery by pod.


def test_selectors_pick_pods_by_every_label() -> None:
    assert selects({"a": "1", "b": "2"}, {"a": "1", "b": "2", "c": "3"})
    assert not selects({"a": "1", "b": "2"}, {"a": "1"})
    assert not selects({}, {"a": "1"}), "a Service without a selector picks no pods"
    assert not selects(None, {"a": "1"})


def test_only_ready_running_pods_with_an_address_count() -> None:
    engine = deployment_of(rendered(), "aggregated")
    ready = pod_of(engine, "a", ip="127.1.0.1")
    assert pod_is_ready(ready)
    not_ready = pod_of(
        engine, "b", ip="127.1.0.2", conditions=[{"type": "Ready", "status": "False"}]
    )
    assert not pod_is_ready(not_ready)
    assert not pod_is_ready(pod_of(engine, "c", ip=None))
    deleting = pod_of(engine, "d", ip="127.1.0.4")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pod_is_ready(deleting)


def test_ready_pod_urls_follow_the_service_selector() -> None:
    objects = rendered()
    engine = deployment_of(objects, "aggregated")
    (service,) = [
        o
        for o in objects
        if o["kind"] == "Service" and o["metadata"]["name"] == "llama-3-1-8b-aggregated"
    ]
    router = deployment_of(objects, "router")
    pods = [
        pod_of(engine, "a", ip="127.1.0.1"),
        pod_of(engine, "b", ip="127.1.0.2"),
        pod_of(engine, "c", ip="127.1.0.3", conditions=[{"type": "Ready", "status": "False"}]),
        pod_of(router, "r", ip="127.1.0.4"),
    ]
    selector = service_selector(service)
    assert selector is not None
    assert ready_pod_urls(pods, selector, 8000) == [
        "http://127.1.0.1:8000",
        "http://127.1.0.2:8000",
    ]
    assert service_selector(None) is None
    assert service_selector({"spec": {}}) is None


def test_the_operator_renders_pod_discovery_when_asked() -> None:
    for discovery, resources, group in (
        (DiscoveryMode.PODS, ["pods", "services"], ""),
        (DiscoveryMode.ENDPOINT_SLICES, ["endpointslices"], "discovery.k8s.io"),
    ):
        objects = rendered(discovery)
        (role,) = [o for o in objects if o["kind"] == "Role"]
        assert role["rules"] == [
            {"apiGroups": [group], "resources": resources, "verbs": ["get", "list", "watch"]}
        ]
        args = deployment_of(objects, "router")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert ("--discovery" in args) == (discovery == DiscoveryMode.PODS)


# Prometheus with Kubernetes service discovery.


def test_the_pod_discovery_job_keeps_annotated_pods_and_maps_their_labels() -> None:
    job = kubernetes_pods_job(
        "kubernetes-pods",
        api_server="https://127.0.0.1:6443",
        ca_file=Path("/pki/ca.crt"),
        token_file=Path("/state/prometheus.token"),
        namespaces=["fleet"],
    )
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["api_server"] == "https://127.0.0.1:6443"
    assert sd["tls_config"] == {"ca_file": "/pki/ca.crt"}
    assert sd["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/state/prometheus.token",
    }
    assert sd["namespaces"] == {"names": ["fleet"]}
    rules = job["relabel_configs"]
    keep = rules[0]
    assert keep["action"] == "keep"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    by_target = {r.get("target_label"): r for r in rules}
    assert by_target["__address__"]["source_labels"] == [
        "__meta_kubernetes_pod_ip",
        "__meta_kubernetes_pod_annotation_prometheus_io_port",
    ]
    assert by_target["__metrics_path__"]["source_labels"] == [
        "__meta_kubernetes_pod_annotation_prometheus_io_path"
    ]
    assert by_target["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert by_target["pod"]["source_labels"] == ["__meta_kubernetes_pod_name"]
    assert {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"} in rules
    document = yaml.safe_load(config_text([job], 1.0))
    assert document["scrape_configs"][0]["job_name"] == "kubernetes-pods"


def test_prometheus_reads_pods_and_nothing_else() -> None:
    account, role, binding = pod_discovery_rbac("prometheus", "monitoring")
    assert account["metadata"] == {"name": "prometheus", "namespace": "monitoring"}
    assert role["kind"] == "ClusterRole"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}
    ]


def test_rendered_pods_carry_what_the_discovery_job_keeps() -> None:
    # Engines serve metrics on their API port; routers on their admin port, never the users'.
    for component, port in (("aggregated", "8000"), ("router", "8001")):
        template = deployment_of(rendered(), component)["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == port
        assert annotations["prometheus.io/path"] == "/metrics"
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]}
        assert int(port) in ports


def test_state_files_without_the_fleet_still_load(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(
        '{"bin_dir": "/b", "ports": {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3, '
        '"controller_manager": 4, "scheduler": 5, "kwok": 6}, "pids": {}, "node_pools": [], '
        '"started_at": 0}'
    )
    state = State.load(path)
    assert state.fleet is False
    assert state.prometheus_port is None


class FakeKube:
    """Answers a PodWatcher as the API server would: Services by name, then one list and
    the watch events given."""

    def __init__(self, services: dict[str, Wire], pods: list[Wire], events: list[tuple[str, Wire]]):
        self.services = services
        self.pods = pods
        self.events = events

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> Wire | None:
        assert (api_version, kind, namespace) == ("v1", "Service", "fleet")
        return self.services.get(name)

    def list_and_watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None,
        label_selector: str,
        for_s: float | None = None,
    ) -> Iterator[tuple[str, Wire]]:
        assert (api_version, kind, namespace) == ("v1", "Pod", "fleet")
        for pod in self.pods:
            yield "LISTED", pod
        yield "SYNCED", {}
        yield from self.events


def test_the_pod_watcher_publishes_each_change_of_a_backends_ready_pods() -> None:
    objects = rendered()
    engine = deployment_of(objects, "aggregated")
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    backend = parse_backend(
        "deployment=llama-3-1-8b,role=aggregated,engine=sim,model=m,"
        "service=llama-3-1-8b-aggregated,port=8000"
    )
    first, second = pod_of(engine, "a", ip="127.1.0.1"), pod_of(engine, "b", ip="127.1.0.2")
    unready = copy.deepcopy(second)
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    events = [
        ("ADDED", second),
        ("MODIFIED", second),  # nothing changed for the router: not published again
        ("MODIFIED", unready),
        ("DELETED", first),
    ]
    published: list[list[str]] = []
    kube = FakeKube(services, [first], events)
    watcher = PodWatcher(
        kube,  # type: ignore[arg-type]
        "fleet",
        {"llama-3-1-8b-aggregated": backend},
        lambda _, urls: published.append(urls),
    )
    watcher._sync_once()
    assert published == [
        ["http://127.1.0.1:8000"],
        ["http://127.1.0.1:8000", "http://127.1.0.2:8000"],
        ["http://127.1.0.1:8000"],
        [],
    ]


# The OCI runtime mode: what a kubelet decides before it asks crun to run a container.

IMAGE = ImageConfig(
    entrypoint=("inferfleet",),
    cmd=("router",),
    env=(("PATH", "/opt/venv/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8")),
    user="65532:65532",
)
API = ("127.0.0.1", 6443)
# What the ServiceAccount admission plugin adds to a pod that mounts its account's token.
API_ACCESS = {
    "name": "kube-api-access-x7k2p",
    "projected": {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {
                "configMap": {
                    "name": "kube-root-ca.crt",
                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                }
            },
            {
                "downwardAPI": {
                    "items": [
                        {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                    ]
                }
            },
        ],
    },
}
API_ACCESS_MOUNT = {
    "name": "kube-api-access-x7k2p",
    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
    "readOnly": True,
}


def admitted_router_pod() -> Wire:
    pod = pod_of(deployment_of(rendered(), "router"), "chat-router-abc")
    pod["spec"]["volumes"] = [API_ACCESS]
    pod["spec"]["containers"][0]["volumeMounts"] = [API_ACCESS_MOUNT]
    return pod


def test_an_image_config_is_read_from_its_oci_blob() -> None:
    blob = {
        "architecture": "amd64",
        "config": {
            "User": "65532:65532",
            "Env": ["PATH=/opt/venv/bin:/usr/bin", "A=b=c"],
            "Entrypoint": ["inferfleet"],
            "Cmd": ["router"],
            "WorkingDir": "/home/nonroot",
        },
    }
    assert ImageConfig.from_oci(blob) == ImageConfig(
        ("inferfleet",),
        ("router",),
        (("PATH", "/opt/venv/bin:/usr/bin"), ("A", "b=c")),
        "65532:65532",
        "/home/nonroot",
    )
    assert ImageConfig.from_oci({}) == ImageConfig()


@pytest.mark.parametrize(
    ("reference", "repository", "tag", "digest"),
    [
        ("inferfleet/router:0.1.0", "inferfleet/router", "0.1.0", None),
        ("r.example:5000/inferfleet/router", "r.example:5000/inferfleet/router", None, None),
        ("inferfleet/router@sha256:ab", "inferfleet/router", None, "sha256:ab"),
    ],
)  # fmt: skip
def test_references_split_into_repository_tag_and_digest(
    reference: str, repository: str, tag: str | None, digest: str | None
) -> None:
    assert split_reference(reference) == (repository, tag, digest)
    assert layout_name(reference) == "router"


def test_an_image_is_found_in_its_layout_by_tag_or_digest() -> None:
    index = {
        "manifests": [
            {"digest": "sha256:aa", "annotations": {"org.opencontainers.image.ref.name": "0.1.0"}},
            {"digest": "sha256:bb", "annotations": {"org.opencontainers.image.ref.name": "latest"}},
        ]
    }
    assert manifest_for(index, "inferfleet/router:0.1.0") == "sha256:aa"
    assert manifest_for(index, "ghcr.io/acme/router") == "sha256:bb"
    assert manifest_for(index, "inferfleet/router@sha256:aa") == "sha256:aa"
    assert manifest_for(index, "inferfleet/router:0.2.0") is None


@pytest.mark.parametrize(
    ("container", "want", "rule"),
    [
        ({}, ("inferfleet", "router"), "neither: the image's entrypoint and cmd"),
        ({"command": ["inferfleet", "run"]}, ("inferfleet", "run"), "command drops the cmd"),
        ({"args": ["sim-engine", "--port", "1"]}, ("inferfleet", "sim-engine", "--port", "1"),
         "args replace the cmd"),
        ({"args": []}, ("inferfleet",), "empty args replace the cmd too"),
        ({"command": ["/bin/x"], "args": ["$(NS)", "$$(NS)"]}, ("/bin/x", "fleet", "$(NS)"),
         "both, with references expanded"),
    ],
)  # fmt: skip
def test_the_command_line_follows_the_kubelets_rules(
    container: Wire, want: tuple[str, ...], rule: str
) -> None:
    assert command_line(container, IMAGE, {"NS": "fleet"}) == want, rule


def test_an_image_with_nothing_to_run_is_refused() -> None:
    with pytest.raises(ImageError, match="what to run"):
        command_line({}, ImageConfig(), {})


@pytest.mark.parametrize(
    ("pod_security", "container_security", "user", "want"),
    [
        ({}, {}, "65532:65532", Identity(65532, 65532)),
        ({}, {}, "65532", Identity(65532, 0)),
        ({"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}, {}, "65532:65532",
         Identity(1000, 1000, (2000,))),
        ({"runAsUser": 1000}, {"runAsUser": 1001}, "", Identity(1001, 0)),
        ({"runAsUser": 1000, "supplementalGroups": [5, 7], "fsGroup": 5}, {"runAsGroup": 3}, "",
         Identity(1000, 3, (5, 7))),
    ],
)  # fmt: skip
def test_the_user_is_the_pods_else_the_images(
    pod_security: Wire, container_security: Wire, user: str, want: Identity
) -> None:
    pod = {"spec": {"securityContext": pod_security}}
    container = {"securityContext": container_security}
    assert identity(pod, container, ImageConfig(user=user)) == want


def test_run_as_non_root_refuses_root_and_a_named_user_needs_run_as_user() -> None:
    pod = {"spec": {"securityContext": {"runAsNonRoot": True}}}
    with pytest.raises(ImageError, match="runAsNonRoot"):
        identity(pod, {}, ImageConfig(user="0"))
    with pytest.raises(ImageError, match="not numeric"):
        identity({}, {}, ImageConfig(user="nonroot"))


def test_a_router_pod_launches_from_its_image_with_its_service_account() -> None:
    pod = admitted_router_pod()
    launch = container_launch(pod, pod["spec"]["containers"][0], IMAGE, API)
    assert launch.argv[:2] == ("inferfleet", "router")
    assert "fleet" in launch.argv  # $(POD_NAMESPACE) expanded
    env = dict(launch.env)
    assert env["PATH"] == "/opt/venv/bin:/usr/bin:/bin"  # the image's
    assert env["LANG"] == "C.UTF-8"
    assert env["POD_NAMESPACE"] == "fleet"
    assert env["KUBERNETES_SERVICE_HOST"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert env["HOSTNAME"] == "chat-router-abc"
    # The rendered pod's user, not the image's.
    assert launch.identity == Identity(1000, 1000)  # fsGroup 1000 is its group already
    writable = copy.deepcopy(pod["spec"]["containers"][0])
    writable["securityContext"]["readOnlyRootFilesystem"] = False
    assert container_launch(pod, writable, IMAGE, API).read_only_root is False
    read_only = copy.deepcopy(writable)
    read_only["securityContext"]["readOnlyRootFilesystem"] = True
    assert container_launch(pod, read_only, IMAGE, API).read_only_root is True
    (volume,) = launch.volumes
    assert volume.files == (
        Token("token", 3607),
        ConfigMapKey("ca.crt", "kube-root-ca.crt", "ca.crt"),
        FieldValue("namespace", "fleet"),
    )
    assert launch.mounts == (
        MountPoint(volume.name, "/var/run/secrets/kubernetes.io/serviceaccount", True),
    )


def test_container_env_wins_over_the_images() -> None:
    pod = {"metadata": {"name": "p", "namespace": "n"}, "spec": {}}
    container = {"env": [{"name": "LANG", "value": "de_DE.UTF-8"}]}
    launch = container_launch(pod, container, IMAGE, API)
    assert dict(launch.env)["LANG"] == "de_DE.UTF-8"


@pytest.mark.parametrize(
    ("volume", "match"),
    [
        ({"name": "data", "hostPath": {"path": "/"}}, "hostPath is not supported"),
        ({"name": "data", "projected": {"sources": [{"secret": {"name": "s"}}]}},
         "not supported"),
        ({"name": "keys", "secret": {"secretName": "s", "items": [{"key": "a", "path": "a"}]}},
         "secret items are not supported"),
    ],
)  # fmt: skip
def test_volumes_the_agent_cannot_provide_are_refused(volume: Wire, match: str) -> None:
    pod = {"metadata": {"name": "p", "namespace": "n"}, "spec": {"volumes": [volume]}}
    with pytest.raises(ImageError, match=match):
        pod_volumes(pod)


def test_a_secret_volume_is_every_key_in_its_mode_and_the_pods_fs_group() -> None:
    pod: Wire = {
        "metadata": {"name": "p", "namespace": "n"},
        "spec": {
            "securityContext": {"fsGroup": 65532},
            "volumes": [{"name": "keys", "secret": {"secretName": "s", "defaultMode": 0o440}}],
        },
    }
    assert pod_volumes(pod) == {"keys": Volume("keys", files=(SecretKeys("s", 0o440, 65532),))}
    del pod["spec"]["securityContext"]
    pod["spec"]["volumes"][0]["secret"] = {"secretName": "s"}
    assert pod_volumes(pod)["keys"].files == (SecretKeys("s", 0o644, None),)


def test_the_runtime_config_isolates_all_but_the_network() -> None:
    pod = admitted_router_pod()
    pod["spec"]["volumes"] += [
        {"name": "cache", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    container = pod["spec"]["containers"][0]
    container["volumeMounts"] += [
        {"name": "cache", "mountPath": "/cache"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    container["securityContext"]["readOnlyRootFilesystem"] = True
    launch = container_launch(pod, container, IMAGE, API)
    config = runtime_config(launch, Path("/b/rootfs"), Path("/p/volumes"))
    assert config["root"] == {"path": "/b/rootfs", "readonly": True}
    namespaces = {n["type"] for n in config["linux"]["namespaces"]}
    assert namespaces == {"pid", "mount", "ipc", "uts"}  # the host's network: the pod IP
    process = config["process"]
    assert process["noNewPrivileges"] is True
    assert all(not caps for caps in process["capabilities"].values())
    assert process["user"] == {"uid": 1000, "gid": 1000}
    assert process["args"][:2] == ["inferfleet", "router"]
    assert "KUBERNETES_SERVICE_PORT=6443" in process["env"]
    mounts = {m["destination"]: m for m in config["mounts"]}
    token = mounts["/var/run/secrets/kubernetes.io/serviceaccount"]
    assert token["type"] == "bind"
    assert token["source"] == "/p/volumes/kube-api-access-x7k2p"
    assert "ro" in token["options"]
    assert mounts["/cache"]["source"] == "/p/volumes/cache"
    assert "rw" in mounts["/cache"]["options"]
    assert mounts["/dev/shm"]["type"] == "tmpfs"
    assert mounts["/proc"]["type"] == "proc"


def test_oci_pods_run_what_their_image_and_spec_say_on_their_ip() -> None:
    image = Image("inferfleet/router:0.1.0", Path("/store/router"), "0.1.0", "sha256:aa", IMAGE)
    store = {"inferfleet/router:0.1.0": image}
    pod = admitted_router_pod()
    process = oci_pod_process(pod, store.get, API)
    assert process is not None
    assert process.image == image
    assert process.kind == Kind.ROUTER
    assert process.argv[:2] == ("inferfleet", "router")
    assert process.argv[-2:] == ("--host", "127.1.0.7")
    assert process.launch is not None
    assert process.launch.argv == process.argv
    assert process.service_account == "chat-router"

    # Not in the store: left alone.
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.6.0"
    assert oci_pod_process(pod, store.get, API) is None

    # The operator's own command runs as written: no --host.
    operator = copy.deepcopy(admitted_router_pod())
    operator["spec"]["containers"][0] |= {
        "image": "inferfleet/router:0.1.0",
        "command": ["inferfleet", "run"],
        "args": ["--router-discovery", "pods"],
    }
    process = oci_pod_process(operator, store.get, API)
    assert process is not None
    assert process.kind is None
    assert process.argv == ("inferfleet", "run", "--router-discovery", "pods")


def test_crun_runs_in_a_private_mount_namespace_over_an_overlay() -> None:
    bundle = Bundle(Path("/s/pods/p/bundle"))
    argv = crun_argv(
        "crun", Path("/s/crun"), "ns.p.1234", bundle, Path("/c/rootfs"), hide_unified_cgroup=True
    )
    assert argv[:5] == ("unshare", "--mount", "--propagation", "private", "--")
    script = argv[7]
    assert "umount /sys/fs/cgroup/unified" in script
    assert (
        "mount -t overlay overlay -o "
        "lowerdir=/c/rootfs,upperdir=/s/pods/p/bundle/upper,workdir=/s/pods/p/bundle/work "
        "/s/pods/p/bundle/rootfs"
    ) in script
    assert argv[9:] == (
        "crun", "--root", "/s/crun", "--cgroup-manager=disabled",
        "run", "--bundle", "/s/pods/p/bundle", "ns.p.1234",
    )  # fmt: skip
    plain = crun_argv("crun", Path("/s/crun"), "x", bundle, Path("/c"), hide_unified_cgroup=False)
    assert "umount" not in plain[7]


@pytest.mark.parametrize(
    ("policy", "exit_code", "again"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 3, True),
        ("Never", 0, False),
        ("Never", 1, False),
    ],
)
def test_a_container_restarts_as_its_pods_restart_policy_says(
    policy: str, exit_code: int, again: bool
) -> None:
    assert restarts_after(policy, exit_code) is again


@pytest.mark.parametrize(
    ("exit_code", "phase", "reason"), [(0, "Succeeded", "Completed"), (2, "Failed", "Error")]
)
def test_a_container_that_exits_for_good_ends_its_pod_by_its_exit_status(
    exit_code: int, phase: str, reason: str
) -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    status = terminated_status("check", exit_code, 0, now)
    assert status["phase"] == phase
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "False",
        "ContainersReady": "False",
    }
    (container,) = status["containerStatuses"]
    assert container["name"] == "check"
    assert container["state"]["terminated"] == {
        "exitCode": exit_code,
        "reason": reason,
        "finishedAt": "2026-11-23T12:00:00Z",
    }


class _Secrets:
    """An API client holding one Secret, whose value the test changes."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.reads = 0

    def get(
        self, api_version: str, kind: str, name: str, namespace: str, timeout_s: float
    ) -> dict[str, Any]:
        self.reads += 1
        return {"data": {"api-key": base64.b64encode(self.value.encode()).decode()}}


def test_a_container_s_environment_keeps_the_secret_it_started_with(tmp_path: Path) -> None:
    # As a kubelet: the value is read when the pod's container starts; a later change of the
    # Secret reaches the running pod through its volumes, never by starting it again.
    secrets = _Secrets("first")
    agent = FleetAgent(
        AgentContext(
            kube=secrets,  # type: ignore[arg-type]
            state_dir=tmp_path, api_server="https://127.0.0.1:6443",
            ca_file=tmp_path / "ca.crt", executable="inferfleet",
        )
    )  # fmt: skip
    assert agent._secret("serving", "uid-1", "engine-key", "api-key") == "first"
    secrets.value = "rotated"
    assert agent._secret("serving", "uid-1", "engine-key", "api-key") == "first"
    assert secrets.reads == 1
    # A new pod (a rollout) reads the Secret as it is now.
    assert agent._secret("serving", "uid-2", "engine-key", "api-key") == "rotated"


def test_a_pod_given_a_stopping_pods_ip_starts_when_that_process_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # kwok hands a deleted pod's IP to the next pod at once; the old process may still drain
    # on it. The new pod's process waits for it (not Ready meanwhile), as a kubelet keeps an
    # IP until the sandbox is gone, instead of failing to bind in a crash loop.
    monkeypatch.setattr(PodSupervisor, "start", lambda self: None)
    agent = FleetAgent(
        AgentContext(
            kube=None,  # type: ignore[arg-type]
            state_dir=tmp_path, api_server="https://127.0.0.1:6443",
            ca_file=tmp_path / "ca.crt", executable=EXECUTABLE,
        )
    )  # fmt: skip
    engine = deployment_of(rendered(), "aggregated")
    draining = threading.Event()
    agent._pods = {"uid-old": pod_of(engine, "old", ip="127.1.0.7")}
    agent.reconcile()
    old = agent.supervisors["uid-old"]
    old.thread = threading.Thread(target=draining.wait)  # its process, draining
    old.thread.start()
    agent._pods = {
        "uid-new": pod_of(engine, "new", ip="127.1.0.7"),
        "uid-other": pod_of(engine, "other", ip="127.1.0.8"),
    }
    agent.reconcile()
    new, other = agent.supervisors["uid-new"], agent.supervisors["uid-other"]
    assert other._await_address()  # nothing holds its IP
    reported: list[tuple[bool, str]] = []
    new.report_ready = lambda pod, ready, reason, restarts: reported.append((ready, reason))
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(new._await_address()))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()
    assert reported == [(False, "PodIPHeld")]
    draining.set()  # the old process ends
    waiter.join(5.0)
    assert waited == [True]
    # A pod deleted while it waits never starts.
    holding = threading.Thread(target=threading.Event().wait, daemon=True)
    holding.start()
    stopped = PodSupervisor(
        new.pod, agent.context, new.report_ready, new.report_terminated, [holding]
    )
    stopped.stop()
    assert stopped._await_address() is False


def test_a_deleted_pods_process_serves_through_its_prestop_sleep_then_gets_sigterm(
    tmp_path: Path,
) -> None:
    # As a kubelet runs the preStop hook: the process is signalled only once the sleep is
    # over (the routers have stopped sending it requests meanwhile), within the grace.
    engine = deployment_of(rendered(), "aggregated")
    found = pod_process(pod_of(engine, "llama-0"), EXECUTABLE)
    assert found is not None
    pod = dataclasses.replace(found, pre_stop_s=1.0, grace_s=10.0, readiness=None)
    context = AgentContext(
        kube=None,  # type: ignore[arg-type]
        state_dir=tmp_path, api_server="https://127.0.0.1:6443",
        ca_file=tmp_path / "ca.crt", executable=EXECUTABLE,
    )  # fmt: skip
    supervisor = PodSupervisor(pod, context, lambda *_: None, lambda *_: None)
    signalled = tmp_path / "signalled"
    script = (
        "import pathlib, signal, sys, time\n"
        "def stop(*_):\n"
        f"    pathlib.Path({str(signalled)!r}).write_text(str(time.monotonic()))\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    supervising = threading.Thread(target=supervisor._supervise, args=(process,))
    supervising.start()
    time.sleep(0.5)  # the handler is installed
    stopped_at = time.monotonic()
    supervisor.stop()
    supervising.join(15.0)
    assert process.poll() == 0
    waited = float(signalled.read_text()) - stopped_at
    assert 1.0 <= waited < 1.0 + 2.0, waited


# kwok's pod-ready and pod-complete stages in the shape `fleet_pod_stages` edits (templates of
# its own here).
POD_READY_STAGE = """kind: Stage
metadata:
  name: pod-ready
spec:
  next:
    statusTemplate: |
      {{ $now := Now }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
      {{ end }}
---
kind: Stage
metadata:
  name: pod-complete
spec:
  selector:
    matchExpressions:
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      phase: Succeeded
"""


def test_with_the_fleet_a_job_pod_the_agent_runs_ends_as_its_process_ends() -> None:
    edited = fleet_pod_stages(POD_READY_STAGE)
    complete = edited[edited.index("name: pod-complete") :]
    assert (
        "    - key: '.spec.containers[0].command[1]'\n"
        "      operator: 'NotIn'\n"
        "      values:\n"
        "      - 'weights'\n"
    ) in complete
    with pytest.raises(ValueError, match="pod-complete"):
        fleet_pod_stages(POD_READY_STAGE.replace("'Job'", "'CronJob'"))


def test_with_the_fleet_a_probed_pod_turns_running_unready_for_the_agent_to_make_ready() -> None:
    edited = fleet_pod_stages(POD_READY_STAGE)
    assert "{{ $probed := false }}{{ range .spec.containers }}{{ if .readinessProbe }}" in edited
    for condition in ("Ready", "ContainersReady"):
        assert (
            '        status: {{ if $probed }}"False"{{ else }}"True"{{ end }}\n'
            f"        type: {condition}\n"
        ) in edited
    assert "        ready: {{ if .readinessProbe }}false{{ else }}true{{ end }}\n" in edited
    # Initialized stays as kwok writes it.
    assert '        status: "True"\n        type: Initialized\n' in edited
    # A kwok whose template changed is said so, not edited blindly.
    with pytest.raises(ValueError, match="does not set"):
        fleet_pod_stages(POD_READY_STAGE.replace("type: Ready\n", "type: Readied\n"))
