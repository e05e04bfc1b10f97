"""An InferenceService -> its router: a Deployment of `inferfleet router`, the Service users
call (port 80 -> 8000), a PodDisruptionBudget, and the ServiceAccount, Role and RoleBinding
that let it read EndpointSlices.

The router is told its service (`--service`, the `service` label of its metrics) and its
backends on the command line, one `--backend` per ModelDeployment and role, as
comma-separated `key=value` pairs in a fixed order:

    deployment=NAME,role=ROLE,engine=ENGINE,weight=W,model=SERVED_NAME,service=SVC,port=8000

`service` is the role's headless Service in the router's own namespace: the router watches its
EndpointSlices for the ready engine pods (they change as soon as a pod's readiness does, where
DNS answers are cached), through a ServiceAccount of its own bound to a Role that reads
EndpointSlices in that namespace and nothing else. Pods behind it carry the labels
`inferfleet.io/model-deployment=NAME` and `inferfleet.io/role=ROLE`. `engine` tells the router
which prefill -> decode hand-off protocol a disaggregated pair speaks (vLLM's
kv_transfer_params or TensorRT-LLM's disaggregated params); `weight` is the deployment's share
of traffic. Then the SLO: `--slo-ttft-p95-ms`, `--slo-tpot-p95-ms` (each only when set) and
`--slo-attainment-target`, which the router uses to count each request's SLO outcome.

With `router_discovery=pods` (clusters whose pod addresses EndpointSlices refuse, as the dev
cluster's loopback ones), the router gets `--discovery pods` and its Role reads Services and
pods instead of EndpointSlices: it routes to the Ready pods each Service selects.

Referenced ModelDeployments are passed in by name and must live in the service's namespace; a
missing one raises `MissingReferenceError`, which the reconciler reports as a condition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from inferfleet import __version__
from inferfleet.api.common import API_GROUP, API_VERSION
from inferfleet.api.inference_service import (
    KIND,
    DeploymentRef,
    InferenceService,
    Tenant,
    TenantPriority,
)
from inferfleet.api.model_deployment import ENGINE_API_KEY, ModelDeployment, TopologyMode
from inferfleet.api.rollout import DEFAULT_DRAIN_SECONDS
from inferfleet.engines import ENGINE_PORT, PORT_NAME, roles_of
from inferfleet.render.common import (
    LABEL_COMPONENT,
    LABEL_INFERENCE_SERVICE,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
    PROMETHEUS_PATH,
    PROMETHEUS_PORT,
    PROMETHEUS_SCRAPE,
    ROUTER_APP,
    SPEC_HASH_ANNOTATION,
    Owner,
    account_role_binding,
    apply_order,
    container_security_context,
    dns_label,
    label_value,
    object_meta,
    pod_disruption_budget,
    pod_security_context,
    rolling_update,
    spec_hash,
)
from inferfleet.render.model_deployment import (
    engine_name,
    served_model_name,
    termination_grace_seconds,
)
from inferfleet.render.network import NetworkIsolation, router_network_policies
from inferfleet.render.wake import wake_config_map_name
from inferfleet.router.config import ADMIN_PORT, DiscoveryMode

ROUTER_PORT: Final = 8000
ADMIN_PORT_NAME: Final = "admin"
SERVICE_PORT: Final = 80
ROUTER_REPLICAS: Final = 2
ROUTER_UID: Final = 1000
SCRATCH_VOLUME: Final = "tmp"
DEFAULT_ROUTER_IMAGE: Final = f"inferfleet/router:{__version__}"
"""Placeholder registry namespace, like the sim engine's image; override per install."""


class MissingReferenceError(LookupError):
    """ModelDeployments an InferenceService names that do not exist in its namespace."""

    def __init__(self, service: str, namespace: str | None, missing: Sequence[str]) -> None:
        self.service = service
        self.namespace = namespace
        self.missing = tuple(sorted(missing))
        where = f" in namespace {namespace}" if namespace else ""
        names = ", ".join(self.missing)
        super().__init__(f"InferenceService {service}: ModelDeployment not found{where}: {names}")


def router_name(service: str) -> str:
    return dns_label(f"{service}-router")


def router_service_name(service: str) -> str:
    """The Service users call: the InferenceService's own name where that is a valid one."""
    return dns_label(service)


def router_selector_labels(service: str) -> dict[str, str]:
    return {LABEL_NAME: ROUTER_APP, LABEL_INFERENCE_SERVICE: label_value(service)}


def router_labels(service: str) -> dict[str, str]:
    return router_selector_labels(service) | {
        LABEL_INSTANCE: label_value(service),
        LABEL_COMPONENT: "router",
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def resolve_deployments(
    isvc: InferenceService, owner: Owner, deployments: Mapping[str, ModelDeployment]
) -> list[tuple[DeploymentRef, ModelDeployment]]:
    """The referenced ModelDeployments, in the spec's order; all of them or an error."""
    resolved, missing = [], []
    for ref in isvc.spec.deployments:
        md = deployments.get(ref.name)
        namespace = md.metadata.get("namespace") if md is not None else None
        elsewhere = owner.namespace is not None and namespace not in (None, owner.namespace)
        if md is None or elsewhere:
            missing.append(ref.name)
        else:
            resolved.append((ref, md))
    if missing:
        raise MissingReferenceError(owner.name, owner.namespace, missing)
    return resolved


def backend_args(resolved: Sequence[tuple[DeploymentRef, ModelDeployment]]) -> list[str]:
    args = []
    for ref, md in sorted(resolved, key=lambda pair: pair[0].name):
        for role in roles_of(md.spec):
            fields = [
                f"deployment={ref.name}",
                f"role={role.value}",
                f"engine={md.spec.engine.name.value}",
                f"weight={ref.weight}",
                f"model={served_model_name(md.spec)}",
                f"context={md.spec.max_model_length()}",
                f"seqs={md.spec.batching.max_sequences}",
                f"service={engine_name(ref.name, role)}",
                f"port={ENGINE_PORT}",
            ]
            if md.spec.engine.api_key_secret is not None:
                fields.append(f"keyfile={ENGINE_KEYS_DIR}/{ref.name}/{ENGINE_API_KEY}")
            if md.spec.adapters:
                fields.append("adapters=" + ";".join(a.name for a in md.spec.adapters))
            args += ["--backend", ",".join(fields)]
    return args


def router_args(
    isvc: InferenceService,
    resolved: Sequence[tuple[DeploymentRef, ModelDeployment]],
    discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES,
) -> list[str]:
    slo = isvc.spec.slo
    args = ["--service", str(isvc.metadata["name"]), "--port", str(ROUTER_PORT)]
    args += ["--admin-port", str(ADMIN_PORT)]
    args += ["--namespace", "$(POD_NAMESPACE)"]
    if discovery != DiscoveryMode.ENDPOINT_SLICES:
        args += ["--discovery", discovery.value]
    args += backend_args(resolved)
    args += ["--drain-timeout", str(router_drain_seconds(resolved))]
    if slo.ttft_p95_ms is not None:
        args += ["--slo-ttft-p95-ms", f"{slo.ttft_p95_ms:g}"]
    if slo.tpot_p95_ms is not None:
        args += ["--slo-tpot-p95-ms", f"{slo.tpot_p95_ms:g}"]
    args += ["--slo-attainment-target", f"{slo.attainment_target:g}"]
    if may_sleep(isvc, resolved):
        args += ["--wake-timeout", str(isvc.spec.autoscaling.wake_timeout_seconds)]
        args += ["--wake-config-map", wake_config_map_name(str(isvc.metadata["name"]))]
    return args + tenant_args(isvc.spec.tenants)


def router_drain_seconds(resolved: Sequence[tuple[DeploymentRef, ModelDeployment]]) -> int:
    """How long a router going away lets its streams run on: as long as its slowest-draining
    deployment's engines do."""
    return max((md.spec.drain_seconds() for _, md in resolved), default=DEFAULT_DRAIN_SECONDS)


def may_sleep(
    isvc: InferenceService, resolved: Sequence[tuple[DeploymentRef, ModelDeployment]]
) -> bool:
    """Whether the autoscaler may take one of the service's deployments to zero replicas:
    then its router holds requests while they wake, and pushes their count (`render.wake`)."""
    autoscaling = isvc.spec.autoscaling
    return any(
        autoscaling.scales_to_zero(
            disaggregated=md.spec.topology.mode == TopologyMode.DISAGGREGATED
        )
        for _, md in resolved
    )


def wake_config_map(owner: Owner) -> dict[str, Any]:
    """The ConfigMap the router pushes its held requests to (`render.wake`); the operator
    sets only its metadata, the router its data."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(wake_config_map_name(owner.name), owner, router_labels(owner.name)),
    }


TENANT_KEYS_DIR: Final = "/etc/inferfleet/tenants"
ENGINE_KEYS_DIR: Final = "/etc/inferfleet/engine-keys"
"""Where each deployment's engine key is mounted in the router (`<dir>/<deployment>/api-key`)."""
"""Where each tenant's key Secret is mounted in the router, one directory per tenant."""


def tenant_args(tenants: Sequence[Tenant]) -> list[str]:
    args = []
    for tenant in tenants:
        limits = tenant.limits
        fields = [f"name={tenant.name}", f"keys={TENANT_KEYS_DIR}/{tenant.name}"]
        if limits.requests_per_second is not None:
            fields.append(f"rps={limits.requests_per_second:g}")
        if limits.tokens_per_minute is not None:
            fields.append(f"tpm={limits.tokens_per_minute}")
        if limits.max_concurrent_requests is not None:
            fields.append(f"concurrency={limits.max_concurrent_requests}")
        if tenant.models:
            fields.append("models=" + ";".join(tenant.models))
        if tenant.priority is not TenantPriority.INTERACTIVE:
            fields.append(f"priority={tenant.priority.value}")
        args += ["--tenant", ",".join(fields)]
    return args


def tenant_volumes(tenants: Sequence[Tenant]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each tenant's key Secret as a volume (readable by the router's group only) and its
    mount. The kubelet updates the files when the Secret changes; the router reads them
    again, so rotating a key rolls nothing out."""
    # Numbered: a tenant's name may be as long as a volume's.
    volumes = [
        {"name": f"tenant-{i}", "secret": {"secretName": t.api_key_secret, "defaultMode": 0o440}}
        for i, t in enumerate(tenants)
    ]
    mounts = [
        {"name": f"tenant-{i}", "mountPath": f"{TENANT_KEYS_DIR}/{t.name}", "readOnly": True}
        for i, t in enumerate(tenants)
    ]
    return volumes, mounts


def engine_key_volumes(
    resolved: Sequence[tuple[DeploymentRef, ModelDeployment]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The engine key Secret of each deployment that has one, as a volume (readable by the
    router's group only; the key is its `api-key` file), and its mount: a directory, not a
    subPath, so the kubelet updates the file when the Secret changes and the router reads it
    again (`router.keyfiles.EngineKeys`)."""
    keyed = [
        (ref.name, md.spec.engine.api_key_secret)
        for ref, md in sorted(resolved, key=lambda pair: pair[0].name)
        if md.spec.engine.api_key_secret is not None
    ]
    volumes = [
        {
            "name": f"engine-key-{i}",
            "secret": {"secretName": secret, "defaultMode": 0o440},
        }
        for i, (_, secret) in enumerate(keyed)
    ]
    mounts = [
        {"name": f"engine-key-{i}", "mountPath": f"{ENGINE_KEYS_DIR}/{name}", "readOnly": True}
        for i, (name, _) in enumerate(keyed)
    ]
    return volumes, mounts


ROUTER_MEMORY_LIMIT: Final = "1Gi"
"""The router container's memory limit: its idle size (about 70 MiB) plus four times the
request bytes it holds at most by default (128 MiB), with room to spare."""


def _router_container(image: str, args: list[str]) -> dict[str, Any]:
    health = {"path": "/health", "port": PORT_NAME}
    return {
        "name": "router",
        "image": image,
        "command": ["inferfleet", "router"],
        "args": args,
        "ports": [
            {"name": PORT_NAME, "containerPort": ROUTER_PORT, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        "env": [
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            # Who pushed the held requests (`render.wake`).
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        # No CPU limit: the proxy's CPU need follows the request rate, and a limit would
        # throttle streaming responses. Memory is bounded by the router's own caps on what
        # it holds (`RouterConfig.max_in_flight_bytes`): the limit stops a leak, not load.
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": ROUTER_MEMORY_LIMIT},
        },
        "readinessProbe": {
            "httpGet": dict(health),
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": dict(health),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        # The image writes nothing but scratch files, to the /tmp volume.
        "securityContext": {**container_security_context(), "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": "/tmp"}],
    }


def router_deployment(
    owner: Owner,
    isvc: InferenceService,
    resolved: Sequence[tuple[DeploymentRef, ModelDeployment]],
    image: str,
    discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES,
) -> dict[str, Any]:
    labels = router_labels(owner.name)
    tenant_secrets, tenant_mounts = tenant_volumes(isvc.spec.tenants)
    key_secrets, key_mounts = engine_key_volumes(resolved)
    router = _router_container(image, router_args(isvc, resolved, discovery))
    router["volumeMounts"] += tenant_mounts + key_mounts
    template: dict[str, Any] = {
        "metadata": {
            "labels": dict(sorted(labels.items())),
            "annotations": {
                PROMETHEUS_PATH: "/metrics",
                PROMETHEUS_PORT: str(ADMIN_PORT),
                PROMETHEUS_SCRAPE: "true",
            },
        },
        "spec": {
            "serviceAccountName": router_name(owner.name),
            # The token reads what discovery needs in this namespace, nothing else (the Role).
            "automountServiceAccountToken": True,
            "enableServiceLinks": False,
            "securityContext": pod_security_context(ROUTER_UID),
            "containers": [router],
            "volumes": [
                {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
                *tenant_secrets,
                *key_secrets,
            ],
            # The two replicas on different nodes where there is room: one node's loss must
            # not take the endpoint down.
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {
                        "matchLabels": dict(sorted(router_selector_labels(owner.name).items()))
                    },
                }
            ],
            # In-flight streams finish before the router exits: it says 503 on /health as long
            # as an engine's preStop sleep lasts, then drains as its slowest engines do.
            "terminationGracePeriodSeconds": termination_grace_seconds(
                router_drain_seconds(resolved)
            ),
        },
    }
    digest = spec_hash({"template": template})
    template["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = digest
    template["metadata"]["annotations"] = dict(sorted(template["metadata"]["annotations"].items()))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(
            router_name(owner.name), owner, labels, {SPEC_HASH_ANNOTATION: digest}
        ),
        "spec": {
            "replicas": ROUTER_REPLICAS,
            "selector": {"matchLabels": dict(sorted(router_selector_labels(owner.name).items()))},
            "strategy": rolling_update(),
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }


def router_service(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(router_service_name(owner.name), owner, router_labels(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "selector": dict(sorted(router_selector_labels(owner.name).items())),
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": SERVICE_PORT,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def router_service_account(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(router_name(owner.name), owner, router_labels(owner.name)),
        "automountServiceAccountToken": False,
    }


def router_role(
    owner: Owner, discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES, *, wakes: bool = False
) -> dict[str, Any]:
    """Read access to what the router's discovery watches in its namespace; and where the
    service may go to zero, its own wake ConfigMap to push to (by name); nothing else."""
    if discovery == DiscoveryMode.PODS:
        rule = {"apiGroups": [""], "resources": ["pods", "services"]}
    else:
        rule = {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"]}
    rules = [rule | {"verbs": ["get", "list", "watch"]}]
    if wakes:
        rules.append(
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [wake_config_map_name(owner.name)],
                "verbs": ["get", "patch"],
            }
        )
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(router_name(owner.name), owner, router_labels(owner.name)),
        "rules": rules,
    }


def router_pod_disruption_budget(owner: Owner) -> dict[str, Any]:
    return pod_disruption_budget(
        router_name(owner.name),
        owner,
        router_labels(owner.name),
        router_selector_labels(owner.name),
    )


def render_inference_service(
    isvc: InferenceService,
    deployments: Mapping[str, ModelDeployment],
    *,
    router_image: str = DEFAULT_ROUTER_IMAGE,
    router_discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES,
    isolation: NetworkIsolation | None = None,
) -> list[dict[str, Any]]:
    """The router objects of one InferenceService, in apply order. `deployments` maps names
    to the ModelDeployments found in the service's namespace; `router_discovery` is how the
    router finds their replicas; with `isolation`, the NetworkPolicies that let the router in
    to their engines and users and Prometheus in to the router.

    Raises `MissingReferenceError` when a referenced ModelDeployment is not among them."""
    owner = Owner.of(f"{API_GROUP}/{API_VERSION}", KIND, isvc.metadata)
    resolved = resolve_deployments(isvc, owner, deployments)
    wakes = may_sleep(isvc, resolved)
    objects = [
        router_service_account(owner),
        router_role(owner, router_discovery, wakes=wakes),
        account_role_binding(router_name(owner.name), owner, router_labels(owner.name)),
        *([wake_config_map(owner)] if wakes else []),
        router_service(owner),
        router_pod_disruption_budget(owner),
        router_deployment(owner, isvc, resolved, router_image, router_discovery),
    ]
    if isolation is not None:
        objects += router_network_policies(
            owner,
            router_labels(owner.name),
            router_selector_labels(owner.name),
            [str(md.metadata["name"]) for _, md in resolved],
            router_port=ROUTER_PORT,
            isolation=isolation,
        )
    return apply_order(objects)
