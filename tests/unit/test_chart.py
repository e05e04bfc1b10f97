"""The Helm chart (charts/inferfleet): linted and templated by a real helm, built from its Go
module by tools/helm/build.sh, and holding what users rely on: the generated CRDs and RBAC,
images from values, a schema that refuses bad values, monitoring that is opt-in.

Regenerate the chart's rules file after an intended change of operator/inferfleet/render/rbac.py:
INFERFLEET_UPDATE_GOLDEN=1 pytest tests/unit/test_chart.py. The chart's crds/ are written by
`inferfleet crds`."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from inferfleet import __version__
from inferfleet.api.catalog import GpuSpec, GpuType
from inferfleet.api.crd import crd_files
from inferfleet.cli.common import load_gpu_catalog
from inferfleet.devcluster.tools import TOOLS_DIR, cached_tool
from inferfleet.render import render_inference_service
from inferfleet.render.rbac import (
    CLUSTER_READ_RULES,
    LEADER_ELECTION_RULES,
    NAMESPACED_RULES,
    NAMESPACES_RULE,
    Rule,
    cluster_wide,
    single_namespace,
)
from tests.unit.golden import check_text
from tests.unit.golden.specs import AGGREGATED_EXAMPLE, example_objects

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO_ROOT / "charts" / "inferfleet"
RULES_FILE: Final = CHART / "files" / "operator-rules.yaml"
HELM_BUILD_SCRIPT: Final = TOOLS_DIR / "helm" / "build.sh"
HELM_BIN_VARIABLE: Final = "INFERFLEET_HELM_BIN"

RELEASE: Final = "inferfleet"
NAMESPACE: Final = "team-a"
OPERATOR: Final = "inferfleet-operator"

Manifest = dict[str, Any]


@functools.cache
def helm_binary() -> Path:
    """helm from $INFERFLEET_HELM_BIN (a directory), or tools/helm/build.sh's cache (built on
    first use, a few minutes). `make unit` and `make e2e` build it first: never skipped."""
    directory = cached_tool(HELM_BIN_VARIABLE, HELM_BUILD_SCRIPT)
    binary = directory / "helm"
    assert binary.is_file(), f"no helm in {directory}: run `make helm`"
    return binary


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # HOME and the XDG dirs point nowhere useful on purpose: nothing from a user's helm config
    # (repositories, plugins) takes part.
    result = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True, text=True, check=False, timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent", "HELM_CACHE_HOME":
             "/nonexistent/cache", "HELM_CONFIG_HOME": "/nonexistent/config",
             "HELM_DATA_HOME": "/nonexistent/data"},
    )  # fmt: skip
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result


def set_flags(values: dict[str, str]) -> list[str]:
    return [flag for key, value in values.items() for flag in ("--set", f"{key}={value}")]


def template(
    values: dict[str, str] | None = None,
    namespace: str = NAMESPACE,
    strings: dict[str, str] | None = None,
) -> list[Manifest]:
    """Every object `helm install` would create (chart tests included, CRDs too). `values` are
    typed as a values file types them; `strings` are taken as written."""
    string_flags = [f"--set-string={key}={value}" for key, value in (strings or {}).items()]
    result = helm(
        "template", RELEASE, str(CHART), "--namespace", namespace, "--include-crds",
        *set_flags(values or {}), *string_flags,
    )  # fmt: skip
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: Sequence[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {kinds(objects)}"
    return found[0]


def kinds(objects: Sequence[Manifest]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def operator_container(objects: Sequence[Manifest]) -> Manifest:
    deployment = find(objects, "Deployment", OPERATOR)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def flag(container: Manifest, name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"{name}=")]
    assert len(values) <= 1, f"{name} given {len(values)} times"
    return values[0] if values else None


# The rules file the chart reads, generated from the operator's code -----------------------


def _rules(rules: Sequence[Rule]) -> list[dict[str, Any]]:
    return [rule.to_wire() for rule in rules]


def rules_file_text() -> str:
    groups = {
        "namespaced": NAMESPACED_RULES,
        "clusterReader": CLUSTER_READ_RULES,
        "clusterScopeOnly": (NAMESPACES_RULE,),
        "leaderElection": LEADER_ELECTION_RULES,
    }
    header = [
        "# Generated from operator/inferfleet/render/rbac.py. Do not edit; regenerate with",
        "#   INFERFLEET_UPDATE_GOLDEN=1 pytest tests/unit/test_chart.py",
        "# The operator's grants, as deploy/rbac/ has them: `namespaced` in the watched namespace",
        "# (or cluster-wide), `clusterReader` always cluster-wide, `clusterScopeOnly` only when it",
        "# watches every namespace, `leaderElection` in the operator's own namespace.",
        "#",
        "# Why each rule:",
    ]
    header += [f"#   {r.describe()}: {r.why}" for rules in groups.values() for r in rules]
    body = yaml.safe_dump({key: _rules(rules) for key, rules in groups.items()}, sort_keys=False)
    return "\n".join(header) + "\n" + body


def test_rules_file_is_up_to_date() -> None:
    check_text(RULES_FILE, rules_file_text())


def test_chart_crds_are_the_generated_ones() -> None:
    committed = {p.name: p.read_text("utf-8") for p in (CHART / "crds").glob("*.yaml")}
    assert committed == crd_files(), "charts/inferfleet/crds/ is out of date: run `inferfleet crds`"


def test_chart_and_app_version_are_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == __version__
    assert chart["appVersion"] == __version__


# helm lint and template -------------------------------------------------------------------

MONITORING_ON: Final = {
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.podMonitor.enabled": "true",
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.dashboards.enabled": "true",
}


@pytest.mark.parametrize(
    "values",
    [{}, {"rbac.scope": "namespace"}, MONITORING_ON],
    ids=["defaults", "single-namespace", "monitoring"],
)
def test_lint_strict_passes(values: dict[str, str]) -> None:
    result = helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *set_flags(values))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout


def test_default_install_is_the_operator_its_identity_and_the_crds() -> None:
    objects = template()
    assert kinds(objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "Deployment",
        "Pod",  # the chart test, created only by `helm test`
        "PodDisruptionBudget",
        "Role",  # leader election's Lease, in the release namespace
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    generated = [yaml.safe_load(text) for text in crd_files().values()]
    assert sorted(crds, key=str) == sorted(generated, key=str)


def test_nothing_namespaced_lands_outside_the_release_namespace() -> None:
    for scope in ("cluster", "namespace"):
        objects = template({"rbac.scope": scope, **MONITORING_ON}, namespace="ml-serving")
        for obj in objects:
            namespace = obj["metadata"].get("namespace")
            cluster_scoped = obj["kind"] in {
                "ClusterRole",
                "ClusterRoleBinding",
                "CustomResourceDefinition",
            }
            assert namespace == (None if cluster_scoped else "ml-serving"), obj["metadata"]
        assert "inferfleet-system" not in json.dumps(objects)


def test_two_leader_elected_replicas_on_different_nodes_by_default() -> None:
    objects = template()
    spec = find(objects, "Deployment", OPERATOR)["spec"]
    assert spec["replicas"] == 2
    # A new pod starts as a follower; the old leader releases the Lease as it stops.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    container = operator_container(objects)
    assert "--leader-elect" in container["args"]
    assert flag(container, "--leader-election-namespace") == "$(POD_NAMESPACE)"
    assert flag(container, "--leader-election-id") == OPERATOR
    downward = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "valueFrom" in e
    }
    assert downward["POD_NAME"] == "metadata.name"
    assert downward["POD_NAMESPACE"] == "metadata.namespace"
    # The probes hit the endpoint a follower serves too while it waits.
    assert container["livenessProbe"]["httpGet"]["path"] == urlsplit_path(
        flag(container, "--liveness")
    )
    selector = spec["selector"]["matchLabels"]
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }
    budget = find(objects, "PodDisruptionBudget", OPERATOR)
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    role = find(objects, "Role", f"{OPERATOR}-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [rule.to_wire() for rule in LEADER_ELECTION_RULES]
    binding = find(objects, "RoleBinding", f"{OPERATOR}-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
    ]


def urlsplit_path(url: str | None) -> str:
    assert url is not None
    return "/" + url.split("://", 1)[1].split("/", 1)[1]


def test_without_leader_election_one_replica_is_replaced_whole() -> None:
    objects = template({"leaderElection.enabled": "false", "replicaCount": "1"})
    spec = find(objects, "Deployment", OPERATOR)["spec"]
    # Never two operators at once, not even during a rollout.
    assert spec["strategy"] == {"type": "Recreate"}
    container = operator_container(objects)
    assert "--leader-elect" not in container["args"]
    assert flag(container, "--leader-election-id") is None
    assert "PodDisruptionBudget" not in kinds(objects)
    assert "Role" not in kinds(objects)
    # One leader-elected replica: nothing to keep through a drain.
    assert "PodDisruptionBudget" not in kinds(template({"replicaCount": "1"}))


def test_affinity_from_the_values_replaces_the_default() -> None:
    objects = template(
        {
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].key": "pool",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
            ".nodeSelectorTerms[0].matchExpressions[0].operator": "Exists",
        }
    )
    affinity = find(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["affinity"]
    assert list(affinity) == ["nodeAffinity"]


def test_operator_runs_locked_down_with_its_probe_and_limits() -> None:
    objects = template()
    deployment = find(objects, "Deployment", OPERATOR)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == OPERATOR
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(objects)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert container["command"] == ["inferfleet", "run"]
    # Health and metrics listen on the pod's IP, where the kubelet probes and Prometheus scrapes.
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in (
        container["env"]
    )
    assert flag(container, "--liveness") == "http://$(POD_IP):8081/healthz"
    assert flag(container, "--metrics-address") == "$(POD_IP)"
    assert flag(container, "--metrics-port") == "8080"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    # Cluster-wide by default: no namespace to restrict the watch to.
    assert flag(container, "--namespace") is None
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8080"


def test_images_come_from_the_values() -> None:
    default = operator_container(template())
    assert default["image"] == f"inferfleet/operator:{__version__}"
    assert flag(default, "--router-image") == f"inferfleet/router:{__version__}"
    assert flag(default, "--sim-engine-image") == f"inferfleet/sim-engine:{__version__}"

    objects = template(
        {
            "image.registry": "registry.example.com:5000/ml",
            "image.tag": "0.1.0-rc1",
            "image.router.repository": "platform/llm-router",
        }
    )
    container = operator_container(objects)
    assert container["image"] == "registry.example.com:5000/ml/inferfleet/operator:0.1.0-rc1"
    assert flag(container, "--router-image") == (
        "registry.example.com:5000/ml/platform/llm-router:0.1.0-rc1"
    )
    assert flag(container, "--sim-engine-image") == (
        "registry.example.com:5000/ml/inferfleet/sim-engine:0.1.0-rc1"
    )
    test_pod = find(objects, "Pod")
    assert test_pod["spec"]["containers"][0]["image"] == container["image"]


def test_operator_settings_come_from_the_values() -> None:
    container = operator_container(
        template(
            {
                "operator.prometheusUrl": "http://prometheus.monitoring.svc:9090",
                "operator.routerDiscovery": "pods",
                "operator.autoscaleInterval": "30",
            }
        )
    )
    assert flag(container, "--prometheus-url") == "http://prometheus.monitoring.svc:9090"
    assert flag(container, "--router-discovery") == "pods"
    assert flag(container, "--autoscale-interval") == "30"
    assert flag(operator_container(template()), "--prometheus-url") is None

    ipv6 = operator_container(template(strings={"operator.listenAddress": "::"}))
    assert flag(ipv6, "--liveness") == "http://[::]:8081/healthz"
    assert flag(ipv6, "--metrics-address") == "::"


def test_the_gpu_catalog_reaches_the_operator_as_a_file_it_reads(tmp_path: Path) -> None:
    objects = template(
        {
            "operator.gpuCatalog.H100-80GB.hourlyPriceUsd": "2",
            "operator.gpuCatalog.H100-80GB.nodeProductLabel": "NVIDIA-H100-SXM5-80GB",
        }
    )
    container = operator_container(objects)
    path = Path(str(flag(container, "--gpu-catalog")))
    pod = find(objects, "Deployment", OPERATOR)["spec"]["template"]
    (mount,) = [m for m in container["volumeMounts"] if path.is_relative_to(m["mountPath"])]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    config_map = find(objects, "ConfigMap", volume["configMap"]["name"])
    written = config_map["data"][path.name]
    catalog_file = tmp_path / path.name
    catalog_file.write_text(written)
    gpus = load_gpu_catalog(catalog_file)
    assert gpus[GpuType.H100_80GB].hourly_price_usd == 2
    assert gpus[GpuType.H100_80GB].node_product_label == "NVIDIA-H100-SXM5-80GB"
    assert "inferfleet.io/gpu-catalog-hash" in pod["metadata"]["annotations"]
    default = template()
    assert flag(operator_container(default), "--gpu-catalog") is None
    names = [o["metadata"]["name"] for o in default if o["kind"] == "ConfigMap"]
    assert not [name for name in names if name.endswith("-gpu-catalog")]


def test_the_gpu_catalog_schema_names_the_catalogs_types_and_fields() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    catalog = schema["properties"]["operator"]["properties"]["gpuCatalog"]
    assert catalog["propertyNames"]["enum"] == [t.value for t in GpuType]
    fields = catalog["additionalProperties"]["properties"]
    assert sorted(fields) == sorted(f.alias or n for n, f in GpuSpec.model_fields.items())


def wire(objects: Sequence[Manifest], kind: str) -> list[Manifest]:
    """The grants of the objects of one kind: rules of roles, roleRef and subjects of bindings."""
    keys = ("rules",) if kind.endswith("Role") else ("roleRef", "subjects")
    return sorted(
        ({key: o[key] for key in keys} for o in objects if o["kind"] == kind), key=json.dumps
    )


def rbac_objects(objects: Sequence[Manifest]) -> list[Manifest]:
    rbac_kinds = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    return [o for o in objects if o["kind"] in rbac_kinds]


def test_cluster_wide_rbac_is_the_generated_one() -> None:
    rendered = rbac_objects(template())
    generated = cluster_wide(NAMESPACE)
    assert kinds(rendered) == kinds(generated)
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert wire(rendered, kind) == wire(generated, kind)


def test_single_namespace_rbac_is_the_generated_one() -> None:
    objects = template({"rbac.scope": "namespace"})
    rendered = rbac_objects(objects)
    generated = single_namespace(NAMESPACE)
    assert kinds(rendered) == kinds(generated)
    for kind in ("Role", "ClusterRole"):
        assert wire(rendered, kind) == wire(generated, kind)
    # The names of the CRD reader differ (one per release namespace, so installs coexist);
    # what each binding grants, to whom, does not.
    for kind, role_kind, name in (
        ("RoleBinding", "Role", OPERATOR),
        ("RoleBinding", "Role", f"{OPERATOR}-leader-election"),
        ("ClusterRoleBinding", "ClusterRole", None),
    ):
        binding = find(rendered, kind, name)
        role = find(rendered, role_kind, name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}
        ]
    assert find(rendered, "Role", OPERATOR)["metadata"]["namespace"] == NAMESPACE
    assert flag(operator_container(objects), "--namespace") == NAMESPACE


def test_tenant_namespaces_rbac_grants_only_in_those_namespaces() -> None:
    objects = template({"rbac.scope": "namespaces", "rbac.namespaces": "{team-b,team-c}"})
    rendered = rbac_objects(objects)
    namespaced = single_namespace(NAMESPACE)
    operator_roles = [
        o for o in rendered if o["kind"] == "Role" and o["metadata"]["name"] == OPERATOR
    ]
    assert sorted(r["metadata"]["namespace"] for r in operator_roles) == ["team-b", "team-c"]
    # Each is the single-namespace Role; nothing of the operator's grants is cluster-wide but
    # the CRD reader (the release namespace keeps only the leader election's Lease grant).
    generated_role = find(namespaced, "Role", OPERATOR)["rules"]
    assert all(r["rules"] == generated_role for r in operator_roles)
    assert wire(rendered, "ClusterRole") == wire(namespaced, "ClusterRole")
    bindings = [
        b for b in rendered if b["kind"] == "RoleBinding" and b["metadata"]["name"] == OPERATOR
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-b", "team-c"]
    assert all(
        b["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
        for b in bindings
    )
    assert [a for a in operator_container(objects)["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-b",
        "--namespace=team-c",
    ]


def test_two_single_namespace_installs_do_not_share_cluster_objects() -> None:
    def cluster_names(namespace: str) -> set[str]:
        objects = template({"rbac.scope": "namespace"}, namespace=namespace)
        return {o["metadata"]["name"] for o in objects if o["kind"].startswith("Cluster")}

    assert not cluster_names("team-a") & cluster_names("team-b")


def test_monitoring_is_opt_in() -> None:
    default = kinds(template())
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        assert kind not in default


def test_monitoring_objects_select_the_operator_and_the_rendered_workloads() -> None:
    objects = template({**MONITORING_ON, "monitoring.serviceMonitor.labels.release": "kps"})
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    service = find(objects, "Service", OPERATOR)
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"metrics", "health"}

    pod_monitor = find(objects, "PodMonitor")["spec"]
    assert pod_monitor["namespaceSelector"] == {"any": True}
    assert pod_monitor["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "inferfleet"}
    (names,) = pod_monitor["selector"]["matchExpressions"]
    assert names["values"] == ["inferfleet-engine", "inferfleet-router"]
    # The port names the rendered containers carry: the engines' API port, the routers'
    # admin port; each endpoint keeps only its own pods.
    endpoints = {
        e["port"]: e["relabelings"][0]["regex"] for e in pod_monitor["podMetricsEndpoints"]
    }
    assert endpoints == {"http": "inferfleet-engine", "admin": "inferfleet-router"}
    md, isvc = example_objects(AGGREGATED_EXAMPLE)
    routers = render_inference_service(isvc, {str(md.metadata["name"]): md})
    router_ports = {
        p["name"]
        for o in routers
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    assert "admin" in router_ports

    single = find(template({**MONITORING_ON, "rbac.scope": "namespace"}), "PodMonitor")
    assert single["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    tenants = {"rbac.scope": "namespaces", "rbac.namespaces": "{team-b,team-c}"}
    several = find(template({**MONITORING_ON, **tenants}), "PodMonitor")
    assert several["spec"]["namespaceSelector"] == {"matchNames": ["team-b", "team-c"]}


def test_prometheus_rule_is_the_rule_file() -> None:
    rule_file = yaml.safe_load((CHART / "rules" / "inferfleet.rules.yaml").read_text())
    rule = find(template(MONITORING_ON), "PrometheusRule")
    assert rule["spec"]["groups"] == rule_file["groups"]


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert files, "charts/inferfleet/dashboards/ holds no dashboard"
    objects = template({**MONITORING_ON, "monitoring.dashboards.annotations.grafana_folder": "ml"})
    config_maps = [o for o in objects if o["kind"] == "ConfigMap"]
    assert len(config_maps) == len(files)
    shipped = {}
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "ml"}
        shipped.update(config_map["data"])
    assert {name: json.loads(text) for name, text in shipped.items()} == {
        f.name: json.loads(f.read_text()) for f in files
    }


def test_chart_test_calls_the_health_endpoint_with_the_operator_image_and_no_shell() -> None:
    objects = template()
    pod = find(objects, "Pod")
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    # Helm never deletes hooks on uninstall: the pod must go by itself, whatever the outcome,
    # and a failure's log is shown before it goes.
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
        "hook-failed",
    }
    assert annotations["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == operator_container(objects)["image"]
    assert container["command"][:2] == ["python3", "-c"]
    assert not {"sh", "bash", "/bin/sh"} & {Path(part).name for part in container["command"]}
    assert container["command"][-1] == f"http://{OPERATOR}.{NAMESPACE}.svc:8081/healthz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    pinned = find(template({"tests.healthUrl": "http://127.1.0.7:8081/healthz"}), "Pod")
    assert pinned["spec"]["containers"][0]["command"][-1] == "http://127.1.0.7:8081/healthz"


def test_notes_say_what_was_installed_how_to_check_it_and_where_the_images_go() -> None:
    result = helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
        "--set", "image.registry=registry.example.com/ml",
    )  # fmt: skip
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"Deployment {OPERATOR}" in notes
    assert "ClusterRole and ClusterRoleBinding" in notes
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    for store, repository in (("operator", "operator"), ("router", "router")):
        assert (
            f"skopeo copy oci:STORE/{store}:{__version__} "
            f"docker://registry.example.com/ml/inferfleet/{repository}:{__version__}"
        ) in notes
    assert "tools/images/push.sh registry.example.com/ml/inferfleet" in notes
    assert "kubectl apply --server-side --force-conflicts -f charts/inferfleet/crds/" in notes
    assert "operator.prometheusUrl is empty" in notes


def test_packaged_chart_holds_what_the_templates_read(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("inferfleet-*.tgz")
    assert archive.name == f"inferfleet-{__version__}.tgz"
    with tarfile.open(archive) as packaged:
        names = set(packaged.getnames())
    expected = {"values.schema.json", "files/operator-rules.yaml", "rules/inferfleet.rules.yaml"}
    expected |= {f"crds/{name}" for name in crd_files()}
    expected |= {f"dashboards/{p.name}" for p in (CHART / "dashboards").glob("*.json")}
    assert {f"inferfleet/{name}" for name in expected} <= names


# The schema -------------------------------------------------------------------------------


def test_policies_are_opt_in_and_land_where_they_apply() -> None:
    assert not {"ValidatingAdmissionPolicy", "PriorityClass", "ResourceQuota"} & set(
        kinds(template())
    )
    objects = template(
        {
            "policies.enabled": "true",
            "policies.allowedImageRegistries": "{registry.example.com/ml}",
            "policies.tenants[0].namespace": "team-b",
            "policies.tenants[0].gpus": "16",
            "policies.tenants[0].maxGpusPerReplica": "8",
            "policies.tenants[1].namespace": "team-c",
        }
    )
    policies = {o["metadata"]["name"] for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    assert policies == {f"{OPERATOR}-{p}" for p in ("engine-image", "engine-args", "tenant-gpus")}
    bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == policies
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)
    # Each tenant's rules live beside the operator, where tenants cannot edit them.
    tenant = find(objects, "ValidatingAdmissionPolicyBinding", f"{OPERATOR}-tenant-team-b")
    assert tenant["spec"]["paramRef"]["namespace"] == NAMESPACE
    assert tenant["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "team-b"
    }
    params = find(objects, "ConfigMap", tenant["spec"]["paramRef"]["name"])
    assert params["metadata"]["namespace"] == NAMESPACE
    assert params["data"] == {"namespace": "team-b", "maxGpusPerReplica": "8"}
    quota = find(objects, "ResourceQuota")
    assert (quota["metadata"]["namespace"], quota["spec"]["hard"]) == (
        "team-b",
        {"requests.nvidia.com/gpu": "16"},
    )
    assert find(objects, "LimitRange")["metadata"]["namespace"] == "team-b"
    assert sorted(o["metadata"]["name"] for o in objects if o["kind"] == "PriorityClass") == [
        "inferfleet-batch",
        "inferfleet-interactive",
    ]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": "two"}, "replicaCount"),
        # Without leader election two operators would both reconcile.
        ({"replicaCount": "2", "leaderElection.enabled": "false"}, "replicaCount"),
        ({"leaderElection.enabled": "yes"}, "enabled"),
        ({"podDisruptionBudget.minAvailable": "1"}, "minAvailable"),
        ({"rbac.scope": "everything"}, "scope"),
        ({"rbac.scope": "namespaces"}, "namespaces"),
        ({"rbac.scope": "namespaces", "rbac.namespaces": "{Team_B}"}, "namespaces"),
        ({"image.registry": "https://registry.example.com"}, "registry"),
        ({"image.operator.repository": "Inferfleet/Operator"}, "repository"),
        ({"image.pullPolicy": "Sometimes"}, "pullPolicy"),
        ({"image.operatr.repository": "x"}, "operatr"),
        ({"operator.routerDiscovery": "dns"}, "routerDiscovery"),
        ({"operator.healthPort": "0"}, "healthPort"),
        ({"operator.gpuCatalog.H100.hourlyPriceUsd": "2"}, "H100"),
        ({"operator.gpuCatalog.H100-80GB.hourlyPriceUSD": "2"}, "hourlyPriceUSD"),
        ({"operator.listenAddress": "localhost"}, "listenAddress"),
        ({"operator.prometheusUrl": "prometheus:9090"}, "prometheusUrl"),
        ({"podSecurityContext.runAsNonRoot": "false"}, "runAsNonRoot"),
        ({"monitoring.serviceMonitor.interval": "often"}, "interval"),
        ({"monitoring.grafana.enabled": "true"}, "grafana"),
        ({"policies.tenants[0].namespace": "Team_A"}, "namespace"),
        ({"policies.tenants[0].namespace": "a", "policies.tenants[0].gpus": "-1"}, "gpus"),
        ({"policies.allowedImageRegistries": "{https://registry.example.com}"}, "0"),
        ({"policies.deniedEngineArgs": "{trust-remote-code}"}, "0"),
        ({"policies.priorityClasses[0].value": "2000000000"}, "value"),
    ],
)
def test_schema_refuses_bad_values(values: dict[str, str], complaint: str) -> None:
    # --set-string would hide the type errors --set surfaces; --set parses like a values file.
    result = helm("template", RELEASE, str(CHART), *set_flags(values), check=False)
    assert result.returncode != 0, f"{values} accepted"
    assert "schema" in result.stderr, result.stderr
    assert complaint in result.stderr, result.stderr


def test_every_default_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def resolve(node: dict[str, Any]) -> dict[str, Any]:
        ref = node.get("$ref")
        return resolve(schema["definitions"][ref.rsplit("/", 1)[1]]) if ref else node

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        node = resolve(node)
        properties = node.get("properties", {})
        for key, value in values.items():
            assert key in properties or "additionalProperties" in node, f"{path}{key}"
            if key in properties and isinstance(value, dict) and value:
                walk(value, properties[key], f"{path}{key}.")
            else:
                assert key in properties or node["additionalProperties"] is not False

    walk(defaults, schema, "")
    assert schema["additionalProperties"] is False
