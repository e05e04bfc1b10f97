"""A ModelDeployment -> its Kubernetes objects, per role (aggregated, or prefill and decode):
a Deployment of engine pods, a headless Service, a PodDisruptionBudget, and a ConfigMap when
the engine reads config files.

Scheduling: each pod requests `tensor x pipeline` GPUs (requests = limits, as the device
plugin's extended resource wants), selects nodes of the GPU type by a node label (the install's
`Placement`: by default the one NVIDIA's GPU feature discovery sets, `nvidia.com/gpu.product`;
none where the install turns it off and users select GPU nodes themselves) and tolerates the
`nvidia.com/gpu` taint GPU pools carry (any value: `present` on the dev cluster and GKE, other
values elsewhere). `spec.scheduling` adds to that: node labels, node affinity, tolerations, a
priority class, image pull secrets, a spread across a topology label, host CPU and memory; it
never replaces the GPU request, the GPU type's label or the GPU toleration. The `sim` engine
requests no GPU but keeps the node selector and toleration, so the dev cluster's fake GPU
nodes exercise the same placement. A replica is one pod; one that needs more GPUs than a node
of its type has is a group of pods, a node each, in one LeaderWorkerSet per role
(`render.multinode`), with a disruption budget over all the groups' pods.

Rollout: a change of anything the pods run (image, args, env, config file content) changes
the `inferfleet.io/spec-hash` annotation of the pod template and so rolls the pods, one surge
replica at a time and never below the current count. Replica counts are not part of the hash.
`progressDeadlineSeconds` is the engine's cold-start budget plus ten minutes for the image
pull (engine images are 10-20 GB). Config files live in a ConfigMap of a fixed name per role;
the hash, not the name, carries their content into the rollout.

Services are headless: the router picks a replica per request (load- and prefix-aware), so
it resolves the pool's ready pods through DNS rather than going through a virtual IP.

Pods mount no service account token and get no service-link env vars (a Service named `vllm`
would otherwise inject VLLM_PORT, which vLLM reads as its own setting).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, Final

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.common import API_GROUP, API_VERSION
from inferfleet.api.model_deployment import (
    ENGINE_API_KEY,
    KIND,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
    TopologyMode,
)
from inferfleet.api.scheduling import (
    EngineResources,
    NodeAffinity,
    NodeRequirement,
    SchedulingSpec,
    quantity_value,
)
from inferfleet.engines import (
    API_KEY_ENV,
    ENGINE_CONFIG_VOLUME,
    ENGINE_PORT,
    MODEL_CACHE_VOLUME,
    PORT_NAME,
    SHM_GIB_PER_GPU,
    EngineContainer,
    EngineOptions,
    UnsupportedSpecError,
    build_engine_container,
    roles_of,
)
from inferfleet.engines.multinode import group_members, needs_ssh_keys
from inferfleet.planning.coldstart import estimate_cold_start
from inferfleet.planning.memory import weight_bytes_per_gpu
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.render.common import (
    ENGINE_APP,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_MODEL_DEPLOYMENT,
    LABEL_NAME,
    LABEL_ROLE,
    MANAGED_BY,
    PROMETHEUS_PATH,
    PROMETHEUS_PORT,
    PROMETHEUS_SCRAPE,
    SPEC_HASH_ANNOTATION,
    Owner,
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
from inferfleet.render.multinode import (
    ENGINE_WORKER_APP,
    engine_leader_worker_set,
    group_disruption_budget,
    ssh_keys_secret,
    ssh_keys_secret_name,
)
from inferfleet.render.network import NetworkIsolation, engine_network_policy
from inferfleet.render.weight_cache import WeightCacheObjects, cached_spec, render_weight_cache

GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_TOLERATION: Final = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Placement:
    """How one install finds GPU nodes. `gpu_node_label`: the node label whose value names the
    GPU product (the catalog's `node_product_label`), selected on every engine pod; None where
    nodes carry no such label (cloud node pools without GPU feature discovery), and each
    ModelDeployment selects its nodes with `scheduling.nodeSelector` or `nodeAffinity`."""

    gpu_node_label: str | None = GPU_PRODUCT_LABEL


IMAGE_PULL_ALLOWANCE_SECONDS: Final = 600
PRE_STOP_SLEEP_SECONDS: Final = 5
"""How long a deleted engine pod (a scale-in, a rollout) keeps serving before SIGTERM: the
endpoints controller and the routers stop sending it requests first, so none reaches a
listener that has closed; its streams run on meanwhile, and drain after SIGTERM."""
EXIT_MARGIN_SECONDS: Final = 5
"""Beyond the drain, for the process to exit before the kubelet's SIGKILL."""


def termination_grace_seconds(drain_seconds: int) -> int:
    """Time for a deleted pod to end: its preStop sleep, its streams drained after SIGTERM
    (the engine's drain timeout), and the exit."""
    return PRE_STOP_SLEEP_SECONDS + drain_seconds + EXIT_MARGIN_SECONDS


REVISION_HISTORY_LIMIT: Final = 3
STARTUP_BUDGET_FACTOR: Final = 2
"""How much longer than its estimated cold start an engine may take to become healthy before
its startup probe restarts it: the estimate leaves out the image pull and a slow disk."""


def with_startup_budget(
    options: EngineOptions, spec: ModelDeploymentSpec, gpus: GpuCatalog
) -> EngineOptions:
    """The install's cold-start budget, or twice the spec's estimated cold start where that is
    longer: a checkpoint of hundreds of GB downloads for longer than any fixed budget, and a
    startup probe that gives up first restarts the download, for ever."""
    source = spec.model.weight_source
    if source is None:
        return options
    estimate = estimate_cold_start(ReplicaConfig.from_spec(spec, gpus), source, spec.engine.name)
    budget = math.ceil(STARTUP_BUDGET_FACTOR * estimate.seconds)
    if budget <= options.cold_start_seconds:
        return options
    return replace(options, cold_start_seconds=budget)


def served_model_name(spec: ModelDeploymentSpec) -> str:
    """The name requests use for the model: the spec's model name."""
    return spec.model.name


def engine_name(deployment: str, role: Role) -> str:
    """Name of a role's Deployment, Service and PodDisruptionBudget."""
    return dns_label(f"{deployment}-{role.value}")


def config_map_name(deployment: str, role: Role) -> str:
    return dns_label(f"{deployment}-{role.value}-engine")


def selector_labels(deployment: str, role: Role) -> dict[str, str]:
    """The labels that pick a role's pods: immutable in a Deployment, so nothing that may
    change (versions, hashes) belongs here."""
    return {
        LABEL_NAME: ENGINE_APP,
        LABEL_MODEL_DEPLOYMENT: label_value(deployment),
        LABEL_ROLE: role.value,
    }


def deployment_labels(deployment: str) -> dict[str, str]:
    """The labels of what a ModelDeployment renders for all its roles."""
    return {
        LABEL_NAME: ENGINE_APP,
        LABEL_MODEL_DEPLOYMENT: label_value(deployment),
        LABEL_INSTANCE: label_value(deployment),
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def engine_labels(deployment: str, role: Role) -> dict[str, str]:
    return (
        deployment_labels(deployment)
        | selector_labels(deployment, role)
        | {LABEL_COMPONENT: role.value}
    )


def replicas_per_role(
    spec: ModelDeploymentSpec, overrides: Mapping[Role, int] | None = None
) -> dict[Role, int]:
    """The spec's replicas per role (decode is `spec.replicas` when disaggregated), with the
    autoscaler's or a pin's counts in `overrides` taking precedence."""
    counts = dict.fromkeys(roles_of(spec), spec.replicas)
    if spec.topology.prefill is not None and Role.PREFILL in counts:
        counts[Role.PREFILL] = spec.topology.prefill.replicas
    for role, count in (overrides or {}).items():
        if role not in counts:
            raise ValueError(
                f"replicas given for role {role.value}, which a {spec.topology.mode.value} "
                "deployment does not have"
            )
        if count < 0:
            raise ValueError(f"replicas for role {role.value} must be >= 0 (got {count})")
        counts[role] = count
    return counts


def replica_nodes(spec: ModelDeploymentSpec, gpus: GpuCatalog) -> int:
    """Nodes of the GPU type one replica spans (the install's catalog says how many GPUs a
    node has): one, or whole nodes each holding whole tensor groups or a share of one.

    Raises `UnsupportedSpecError` for a replica that would leave part of a node."""
    per_node = gpus[spec.gpu.type].gpus_per_node
    wanted, tensor = spec.parallelism.gpus_per_replica, spec.parallelism.tensor
    if wanted <= per_node:
        return 1
    if wanted % per_node or (per_node % tensor and tensor % per_node):
        raise UnsupportedSpecError(
            "parallelism",
            f"{wanted} GPUs per replica (tensor {tensor} x pipeline "
            f"{spec.parallelism.pipeline}) do not fill whole {spec.gpu.type.value} nodes of "
            f"{per_node} GPUs with whole tensor groups",
        )
    if spec.topology.mode != TopologyMode.AGGREGATED:
        raise UnsupportedSpecError(
            "topology.mode",
            f"a replica of {wanted} GPUs spans {wanted // per_node} nodes, served aggregated "
            "only: disaggregated pools of replicas over several nodes are not supported",
        )
    return wanted // per_node


def engine_config_map(owner: Owner, role: Role, files: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(
            config_map_name(owner.name, role), owner, engine_labels(owner.name, role)
        ),
        "data": dict(sorted(files.items())),
    }


CPUS_PER_GPU: Final = 4
"""CPU cores an engine asks for per GPU: its API server, tokenizer and scheduler, one worker
process per GPU."""
HOST_BYTES_PER_GPU: Final = 4 * 2**30
"""Host memory an engine asks for per GPU beyond its share of the weights (which are read
through host memory as they load) and its /dev/shm: CUDA's host allocations, the tokenizer,
buffers."""
EMULATOR_RESOURCES: Final = {
    "limits": {"memory": "1Gi"},
    "requests": {"cpu": "250m", "memory": "256Mi"},
}
"""The `sim` engine's: a CPU process that emulates the GPU's timing and holds no weights."""
HOST_MEMORY_LIMIT_FACTOR: Final = 2
"""The memory limit over the request: room for a load's peak, a bound on a leak."""


def _doubled(quantity: str) -> str:
    """Twice a quantity, in its own unit ("64Gi" -> "128Gi")."""
    number = quantity.rstrip("mkMGTPi")
    return f"{Decimal(number) * HOST_MEMORY_LIMIT_FACTOR:f}{quantity[len(number) :]}"


def with_resources(resources: dict[str, Any], overlay: EngineResources) -> dict[str, Any]:
    """`resources` with a user's host CPU and memory in place of the planner's. A memory
    request without a limit is limited to `HOST_MEMORY_LIMIT_FACTOR` times it; a limit alone
    lowers the planner's request to it where the request was higher."""
    requests = dict(resources.get("requests", {}))
    limits = dict(resources.get("limits", {}))
    if overlay.cpu is not None:
        requests["cpu"] = overlay.cpu
    if overlay.memory is not None:
        requests["memory"] = overlay.memory
        limits["memory"] = overlay.memory_limit or _doubled(overlay.memory)
    elif overlay.memory_limit is not None:
        limits["memory"] = overlay.memory_limit
        planned = requests.get("memory")
        if planned is None or quantity_value(planned) > quantity_value(overlay.memory_limit):
            requests["memory"] = overlay.memory_limit
    return {"limits": limits, "requests": requests}


def _node_terms(requirements: list[NodeRequirement]) -> dict[str, Any]:
    return {
        "matchExpressions": [
            {
                "key": r.key,
                "operator": r.operator.value,
                **({"values": r.values} if r.values else {}),
            }
            for r in requirements
        ]
    }


def _node_affinity(affinity: NodeAffinity) -> dict[str, Any]:
    rendered: dict[str, Any] = {}
    if affinity.required:
        rendered["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_node_terms(t.match_expressions) for t in affinity.required]
        }
    if affinity.preferred:
        rendered["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": t.weight, "preference": _node_terms(t.match_expressions)}
            for t in affinity.preferred
        ]
    return rendered


def scheduled(
    pod: dict[str, Any], scheduling: SchedulingSpec, selector: Mapping[str, str]
) -> dict[str, Any]:
    """`pod` with a spec's scheduling overlay: everything it sets is added beside what the
    operator sets for the GPUs (the GPU type's node label wins over a user's value for it)."""
    pod = dict(pod)
    pod["nodeSelector"] = dict(sorted((scheduling.node_selector | pod["nodeSelector"]).items()))
    if scheduling.node_affinity is not None:
        affinity = _node_affinity(scheduling.node_affinity)
        if affinity:
            pod["affinity"] = {"nodeAffinity": affinity}
    pod["tolerations"] = [
        *pod["tolerations"],
        *(
            t.model_dump(mode="json", by_alias=True, exclude_none=True)
            for t in scheduling.tolerations
        ),
    ]
    if scheduling.priority_class_name is not None:
        pod["priorityClassName"] = scheduling.priority_class_name
    if scheduling.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in scheduling.image_pull_secrets]
    if scheduling.spread_across is not None:
        pod["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": scheduling.spread_across,
                # A cluster with too few zones or nodes still runs every replica.
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": dict(sorted(selector.items()))},
            }
        ]
    if scheduling.resources is not None:
        [container, *others] = pod["containers"]
        resources = with_resources(container["resources"], scheduling.resources)
        pod["containers"] = [{**container, "resources": resources}, *others]
    return pod


def replica_placement(
    spec: ModelDeploymentSpec, placement: Placement, gpus: GpuCatalog
) -> dict[str, Any]:
    """Where a replica's pods may run, without what they ask of a node: the GPU type's nodes
    and taint, the spec's selector, affinity, tolerations, priority and pull secrets."""
    selector = {}
    if placement.gpu_node_label is not None:
        selector[placement.gpu_node_label] = gpus[spec.gpu.type].node_product_label
    pod: dict[str, Any] = {
        "nodeSelector": selector, "tolerations": [dict(GPU_TOLERATION)], "containers": [{}],
    }  # fmt: skip
    if spec.scheduling is not None:
        where = spec.scheduling.model_copy(update={"resources": None, "spread_across": None})
        pod = scheduled(pod, where, {})
    return {key: value for key, value in pod.items() if key != "containers" and value}


def engine_resources(config: ReplicaConfig, gpus: int) -> dict[str, Any]:
    """GPUs as requested and limited; CPU and host memory requested in proportion (so the pod
    is not BestEffort, the first evicted when a node runs short): the weights' share, /dev/shm
    and `HOST_BYTES_PER_GPU` a GPU, limited to `HOST_MEMORY_LIMIT_FACTOR` times that; no CPU
    limit (throttling would slow every step). An engine without GPUs (`sim`) gets
    `EMULATOR_RESOURCES`."""
    if not gpus:
        return {kind: dict(amounts) for kind, amounts in EMULATOR_RESOURCES.items()}
    weights = weight_bytes_per_gpu(config)
    per_gpu = math.ceil(weights) + HOST_BYTES_PER_GPU + SHM_GIB_PER_GPU * 2**30
    mebibytes = math.ceil(gpus * per_gpu / 2**20)
    return {
        "limits": {
            "memory": f"{mebibytes * HOST_MEMORY_LIMIT_FACTOR}Mi",
            GPU_RESOURCE: str(gpus),
        },
        "requests": {
            "cpu": str(gpus * CPUS_PER_GPU),
            "memory": f"{mebibytes}Mi",
            GPU_RESOURCE: str(gpus),
        },
    }


MODEL_CACHE_FACTOR: Final = 2
MODEL_CACHE_SPARE_BYTES: Final = 4 * 2**30
"""The model cache holds the checkpoint twice at most (a download's partial files beside the
finished ones) and this much more (tokenizer, configs, compiled kernels): past that the
kubelet evicts the pod rather than let it fill the node's disk."""


def _sized_cache(volume: dict[str, Any], config: ReplicaConfig) -> dict[str, Any]:
    checkpoint = weight_bytes_per_gpu(config) * config.gpus
    limit = math.ceil((MODEL_CACHE_FACTOR * checkpoint + MODEL_CACHE_SPARE_BYTES) / 2**30)
    return {**volume, "emptyDir": {**volume.get("emptyDir", {}), "sizeLimit": f"{limit}Gi"}}


def engine_pod_spec(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: Role,
    engine: EngineContainer,
    placement: Placement,
    *,
    gpus: GpuCatalog,
    cache: WeightCacheObjects | None = None,
) -> dict[str, Any]:
    config = ReplicaConfig.from_spec(spec, gpus)
    container = dict(engine.container)
    container["resources"] = engine_resources(config, engine.gpus)
    container["securityContext"] = container_security_context(engine.capabilities)
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}}
    if spec.engine.api_key_secret is not None:
        # From the Secret by the kubelet: the operator never reads it.
        key = {"secretKeyRef": {"name": spec.engine.api_key_secret, "key": ENGINE_API_KEY}}
        container["env"] = [*container.get("env", []), {"name": API_KEY_ENV, "valueFrom": key}]
    volumes = [
        _sized_cache(volume, config) if volume["name"] == MODEL_CACHE_VOLUME else volume
        for volume in engine.volumes
    ]
    if engine.config_files:
        volumes.append(
            {"name": ENGINE_CONFIG_VOLUME, "configMap": {"name": config_map_name(owner.name, role)}}
        )
    if cache is not None:
        volumes.append(cache.volume)
    selector = {}
    if placement.gpu_node_label is not None:
        product = gpus[spec.gpu.type].node_product_label
        selector[placement.gpu_node_label] = product
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(engine.run_as_user),
        "containers": [container],
        **({"initContainers": [cache.wait_container]} if cache else {}),
        "nodeSelector": selector,
        "tolerations": [dict(GPU_TOLERATION)],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec.drain_seconds()),
    }
    if volumes:
        pod["volumes"] = sorted(volumes, key=lambda v: str(v["name"]))
    if spec.scheduling is not None:
        pod = scheduled(pod, spec.scheduling, selector_labels(owner.name, role))
    if not pod["nodeSelector"]:
        del pod["nodeSelector"]
    return pod


def engine_deployment(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: Role,
    engine: EngineContainer,
    replicas: int,
    *,
    placement: Placement | None = None,
    gpus: GpuCatalog | None = None,
    cache: WeightCacheObjects | None = None,
) -> dict[str, Any]:
    labels = engine_labels(owner.name, role)
    pod = engine_pod_spec(
        owner, spec, role, engine, placement or Placement(), gpus=gpus or GpuCatalog.builtin(),
        cache=cache,
    )  # fmt: skip
    # A replica may wait for its weight cache's fill before it starts.
    fill_s = cache.fill_seconds if cache else 0
    template = engine_pod_template(labels, pod, engine)
    digest = spec_hash({"template": template, "configFiles": engine.config_files})
    template["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = digest
    template["metadata"]["annotations"] = dict(sorted(template["metadata"]["annotations"].items()))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(
            engine_name(owner.name, role), owner, labels, {SPEC_HASH_ANNOTATION: digest}
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(sorted(selector_labels(owner.name, role).items()))},
            "strategy": rolling_update(
                *((spec.rollout.max_surge, spec.rollout.max_unavailable) if spec.rollout else ())
            ),
            "revisionHistoryLimit": REVISION_HISTORY_LIMIT,
            "progressDeadlineSeconds": (
                engine.cold_start_seconds + IMAGE_PULL_ALLOWANCE_SECONDS + fill_s
            ),
            "template": template,
        },
    }


def engine_pod_template(
    labels: Mapping[str, str], pod: dict[str, Any], engine: EngineContainer | None
) -> dict[str, Any]:
    """A pod template with `labels`, scraped by Prometheus where `engine` serves metrics."""
    annotations = (
        {}
        if engine is None
        else {
            PROMETHEUS_PATH: engine.metrics_path,
            PROMETHEUS_PORT: str(ENGINE_PORT),
            PROMETHEUS_SCRAPE: "true",
        }
    )
    return {
        "metadata": {"labels": dict(sorted(labels.items())), "annotations": annotations},
        "spec": pod,
    }


def engine_group_set(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: Role,
    engine: EngineContainer,
    replicas: int,
    *,
    nodes: int,
    placement: Placement,
    gpus: GpuCatalog,
    cache: WeightCacheObjects | None = None,
) -> dict[str, Any]:
    """A role whose replica spans `nodes` nodes: one LeaderWorkerSet, a group per replica."""
    secret = ssh_keys_secret_name(owner) if needs_ssh_keys(spec) else None
    leader, worker = group_members(spec, engine, nodes, ssh_keys_secret=secret)
    labels = engine_labels(owner.name, role)
    # `spreadAcross` spreads the groups, by their leaders: a worker spread away from the
    # leaders would leave its own group's (`scheduling.groupTopology` keeps a group together).
    worker_pod = {
        key: value
        for key, value in engine_pod_spec(
            owner, spec, role, worker, placement, gpus=gpus, cache=cache
        ).items()
        if key != "topologySpreadConstraints"
    }
    templates = (
        engine_pod_template(
            labels,
            engine_pod_spec(owner, spec, role, leader, placement, gpus=gpus, cache=cache),
            leader,
        ),
        engine_pod_template(labels | {LABEL_NAME: ENGINE_WORKER_APP}, worker_pod, None),
    )
    return engine_leader_worker_set(
        owner, role, labels, templates, replicas,
        nodes=nodes, config_files=leader.config_files,
        group_topology=spec.scheduling.group_topology if spec.scheduling else None,
        **({"rollout": (spec.rollout.max_surge, spec.rollout.max_unavailable)}
           if spec.rollout else {}),
    )  # fmt: skip


def engine_service(owner: Owner, role: Role) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(
            engine_name(owner.name, role), owner, engine_labels(owner.name, role)
        ),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": dict(sorted(selector_labels(owner.name, role).items())),
            "ports": [
                {"name": PORT_NAME, "port": ENGINE_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def engine_pod_disruption_budget(owner: Owner, role: Role) -> dict[str, Any]:
    return pod_disruption_budget(
        engine_name(owner.name, role),
        owner,
        engine_labels(owner.name, role),
        selector_labels(owner.name, role),
    )


def render_model_deployment(
    md: ModelDeployment,
    *,
    replicas: Mapping[Role, int] | None = None,
    options: EngineOptions | None = None,
    isolation: NetworkIsolation | None = None,
    placement: Placement | None = None,
    gpus: GpuCatalog | None = None,
) -> list[dict[str, Any]]:
    """Every object of one ModelDeployment, in apply order (its NetworkPolicy with
    `isolation`, ConfigMaps, Services, PDBs, Deployments). `replicas` overrides the spec's
    counts per role (autoscaler, pins); `placement` is how the install finds GPU nodes, `gpus`
    its GPU catalog (default: the built-in one): the node label's values, GPUs per node, and
    the weights that size host memory and the model cache.

    Raises `UnsupportedSpecError` for a spec the engine or the renderer cannot honour."""
    owner = Owner.of(f"{API_GROUP}/{API_VERSION}", KIND, md.metadata)
    spec = md.spec
    gpus = gpus or GpuCatalog.builtin()
    nodes = replica_nodes(spec, gpus)
    counts = replicas_per_role(spec, replicas)
    placement = placement or Placement()
    options = with_startup_budget(options or EngineOptions(), spec, gpus)
    cache = render_weight_cache(
        owner, spec, filled=md.status.weight_cache if md.status else None,
        labels=deployment_labels(owner.name),
        placement_pod=replica_placement(spec, placement, gpus), options=options, gpus=gpus,
    )  # fmt: skip
    objects: list[dict[str, Any]] = list(cache.objects) if cache else []
    spec = cached_spec(spec, cache.claim) if cache else spec
    for role in roles_of(spec):
        engine = build_engine_container(
            spec, role, model_name=served_model_name(spec), options=options
        )
        if engine.config_files:
            objects.append(engine_config_map(owner, role, engine.config_files))
        objects.append(engine_service(owner, role))
        if nodes == 1:
            objects += [
                engine_pod_disruption_budget(owner, role),
                engine_deployment(
                    owner,
                    spec,
                    role,
                    engine,
                    counts[role],
                    placement=placement,
                    gpus=gpus,
                    cache=cache,
                ),
            ]
        else:
            labels = engine_labels(owner.name, role)
            if needs_ssh_keys(spec):
                objects.append(ssh_keys_secret(owner, deployment_labels(owner.name)))
            objects += [
                group_disruption_budget(owner, engine_name(owner.name, role), role, labels),
                engine_group_set(
                    owner,
                    spec,
                    role,
                    engine,
                    counts[role],
                    nodes=nodes,
                    placement=placement,
                    gpus=gpus,
                    cache=cache,
                ),
            ]
    if isolation is not None:
        objects.append(engine_network_policy(owner, deployment_labels(owner.name), isolation))
    return apply_order(objects)
