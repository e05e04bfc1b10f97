"""Rendering a ModelDeployment: golden files for the examples, and table tests for labels,
ownership, security, GPUs, placement, disruption budgets, rollout and the spec hash."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.devcluster.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TAINT, gpu_node
from inferfleet.planning.capacity import plan
from inferfleet.render import (
    SPEC_HASH_ANNOTATION,
    UnsupportedSpecError,
    render_model_deployment,
    replicas_per_role,
    spec_hash,
)
from inferfleet.render.common import dns_label, label_value
from inferfleet.render.model_deployment import CPUS_PER_GPU, Placement
from tests.unit.golden import check_golden
from tests.unit.golden.specs import (
    AGGREGATED_EXAMPLE,
    DISAGGREGATED_EXAMPLE,
    aggregated_spec,
    disaggregated_spec,
    example_objects,
    merged,
    model_deployment,
)

Objects = list[dict[str, Any]]
ENGINES = ("vllm", "tensorrt-llm", "sim")
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def spec_on(engine_name: str, /, **changes: Any) -> ModelDeploymentSpec:
    return aggregated_spec(**merged(changes, {"engine": {"name": engine_name}}))


def render(spec: ModelDeploymentSpec, **kwargs: Any) -> Objects:
    return render_model_deployment(model_deployment(spec), **kwargs)


def of_kind(objects: Objects, kind: str) -> Objects:
    return [o for o in objects if o["kind"] == kind]


def deployments(objects: Objects) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["labels"]["inferfleet.io/role"]: d for d in of_kind(objects, "Deployment")
    }


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def template_hash(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION])


@pytest.mark.parametrize(
    ("name", "file", "engine"),
    [
        ("llama-3.1-8b-aggregated-vllm", AGGREGATED_EXAMPLE, None),
        ("llama-3.3-70b-fp8-disaggregated-trtllm", DISAGGREGATED_EXAMPLE, None),
        ("llama-3.3-70b-disaggregated-sim", DISAGGREGATED_EXAMPLE, "sim"),
        ("llama-3.3-70b-nvfp4-b200-vllm", "llama-3.3-70b-nvfp4-b200-vllm.yaml", None),
        ("gpt-oss-120b-mxfp4-moe-vllm", "gpt-oss-120b-mxfp4-moe-vllm.yaml", None),
        ("deepseek-v3-fp8-h200-vllm", "deepseek-v3-fp8-h200-vllm.yaml", None),
        (
            "qwen3-4b-architecture-from-configmap-vllm",
            "qwen3-4b-architecture-from-configmap-vllm.yaml",
            None,
        ),
        ("llama-3.1-8b-lora-vllm", "llama-3.1-8b-lora-vllm.yaml", None),
        ("llama-3.1-405b-bf16-two-nodes-vllm", "llama-3.1-405b-bf16-two-nodes-vllm.yaml", None),
        (
            "llama-3.1-405b-bf16-two-nodes-trtllm",
            "llama-3.1-405b-bf16-two-nodes-trtllm.yaml",
            None,
        ),
    ],
)
def test_examples_render_as_golden(name: str, file: str, engine: str | None) -> None:
    md, _ = example_objects(file)
    if engine is not None:
        spec = ModelDeploymentSpec.model_validate(
            merged(md.spec.to_wire(), {"engine": {"name": engine}})
        )
        md = md.model_copy(update={"spec": spec})
    check_golden(f"render/{name}.yaml", render_model_deployment(md))


def test_objects_per_role_in_apply_order() -> None:
    aggregated = render(aggregated_spec())
    assert [(o["kind"], o["metadata"]["name"]) for o in aggregated] == [
        ("Service", "llama-aggregated"),
        ("PodDisruptionBudget", "llama-aggregated"),
        ("Deployment", "llama-aggregated"),
    ]
    disaggregated = render(disaggregated_spec())
    assert [(o["kind"], o["metadata"]["name"]) for o in disaggregated] == [
        ("ConfigMap", "llama-decode-engine"),
        ("ConfigMap", "llama-prefill-engine"),
        ("Service", "llama-decode"),
        ("Service", "llama-prefill"),
        ("PodDisruptionBudget", "llama-decode"),
        ("PodDisruptionBudget", "llama-prefill"),
        ("Deployment", "llama-decode"),
        ("Deployment", "llama-prefill"),
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_every_object_is_labelled_owned_and_namespaced(engine: str) -> None:
    objects = render(spec_on(engine, topology={"mode": "disaggregated", "prefill": {}}))
    assert objects
    for obj in objects:
        meta = obj["metadata"]
        role = meta["labels"]["inferfleet.io/role"]
        assert meta["labels"] == {
            "app.kubernetes.io/name": "inferfleet-engine",
            "app.kubernetes.io/instance": "llama",
            "app.kubernetes.io/component": role,
            "app.kubernetes.io/managed-by": "inferfleet",
            "inferfleet.io/model-deployment": "llama",
            "inferfleet.io/role": role,
        }
        assert meta["namespace"] == "serving"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "inferfleet.io/v1alpha1",
                "kind": "ModelDeployment",
                "name": "llama",
                "uid": "6f1c2d4e-0000-4000-8000-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_offline_rendering_has_no_owner_or_namespace() -> None:
    objects = render_model_deployment(model_deployment(aggregated_spec(), namespace=None, uid=None))
    for obj in objects:
        assert "ownerReferences" not in obj["metadata"]
        assert "namespace" not in obj["metadata"]


def test_a_name_is_required() -> None:
    md = model_deployment(aggregated_spec()).model_copy(update={"metadata": {}})
    with pytest.raises(ValueError, match=r"metadata\.name is required"):
        render_model_deployment(md)


@pytest.mark.parametrize("engine", ENGINES)
def test_selectors_pick_the_pods_of_one_role(engine: str) -> None:
    objects = render(spec_on(engine, topology={"mode": "disaggregated", "prefill": {}}))
    for role, deployment in deployments(objects).items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector == {
            "app.kubernetes.io/name": "inferfleet-engine",
            "inferfleet.io/model-deployment": "llama",
            "inferfleet.io/role": role,
        }
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        (service,) = [
            s for s in of_kind(objects, "Service") if s["metadata"]["name"].endswith(role)
        ]
        (budget,) = [
            p
            for p in of_kind(objects, "PodDisruptionBudget")
            if p["metadata"]["name"].endswith(role)
        ]
        assert service["spec"]["selector"] == selector
        assert budget["spec"]["selector"] == {"matchLabels": selector}


@pytest.mark.parametrize(
    ("engine", "run_as_user"), [("vllm", 1000), ("sim", 1000), ("tensorrt-llm", None)]
)
def test_security_context(engine: str, run_as_user: int | None) -> None:
    pod = pod_spec(render(spec_on(engine))[-1])
    context = pod["securityContext"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    if run_as_user is None:
        assert "runAsNonRoot" not in context
        assert "runAsUser" not in context
    else:
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] == context["runAsGroup"] == context["fsGroup"] == run_as_user
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False


@pytest.mark.parametrize(
    ("engine", "tensor", "pipeline", "gpus"),
    [
        ("vllm", 1, 1, "1"),
        ("vllm", 4, 2, "8"),
        ("tensorrt-llm", 2, 1, "2"),
        ("sim", 4, 1, None),
    ],
)
def test_gpu_requests_follow_parallelism(
    engine: str, tensor: int, pipeline: int, gpus: str | None
) -> None:
    spec = spec_on(engine, parallelism={"tensor": tensor, "pipeline": pipeline})
    (container,) = pod_spec(render(spec)[-1])["containers"]
    resources = container["resources"]
    if gpus is None:  # the emulator holds no GPU
        assert GPU_RESOURCE not in resources["requests"]
        assert GPU_RESOURCE not in resources["limits"]
    else:
        assert resources["limits"][GPU_RESOURCE] == gpus
        assert resources["requests"][GPU_RESOURCE] == gpus
        assert resources["requests"]["cpu"] == str(int(gpus) * CPUS_PER_GPU)


def mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


def test_engines_ask_for_host_memory_by_their_weights_and_are_never_best_effort() -> None:
    """An engine loads its weights through host memory and shares tensors through /dev/shm:
    its memory request holds its share of both, plus room per GPU; the limit doubles it. No
    pod is BestEffort (the first evicted), the emulator included."""
    small = pod_spec(render(spec_on("vllm"))[-1])["containers"][0]["resources"]
    fp8 = pod_spec(render(spec_on("vllm", precision={"weights": "fp8", "method": "fp8"}))[-1])
    halved = fp8["containers"][0]["resources"]
    # Llama-3.1-8B in BF16 on one GPU: 16 GB of weights, 2 GiB of shm, 4 GiB more.
    assert mebibytes(small["requests"]["memory"]) == pytest.approx(
        (16.06e9 + 6 * 2**30) / 2**20, rel=0.01
    )
    assert mebibytes(halved["requests"]["memory"]) < mebibytes(small["requests"]["memory"])
    for resources in (small, halved):
        request = mebibytes(resources["requests"]["memory"])
        assert mebibytes(resources["limits"]["memory"]) == 2 * request
        assert "cpu" not in resources["limits"]
    emulator = pod_spec(render(spec_on("sim"))[-1])["containers"][0]["resources"]
    assert emulator["requests"]["cpu"]
    assert emulator["limits"]["memory"]


@pytest.mark.parametrize("gpu", list(GpuType))
@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_pods_select_and_tolerate_the_gpu_nodes(gpu: GpuType, engine: str) -> None:
    pod = pod_spec(render(spec_on(engine, gpu={"type": gpu.value}))[-1])
    node = gpu_node(gpu, 0, GpuCatalog.builtin())  # a node as the dev cluster registers it
    for key, value in pod["nodeSelector"].items():
        assert node["metadata"]["labels"][key] == value
    assert pod["nodeSelector"] == {GPU_PRODUCT_LABEL: GpuCatalog.builtin()[gpu].node_product_label}
    (taint,) = node["spec"]["taints"]
    assert taint == GPU_TAINT
    assert any(
        t["key"] == taint["key"]
        and t["effect"] == taint["effect"]
        and (t["operator"] == "Exists" or t.get("value") == taint["value"])
        for t in pod["tolerations"]
    )


def test_volumes_shm_and_model_cache() -> None:
    pod = pod_spec(render(spec_on("vllm", parallelism={"tensor": 4}))[-1])
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    # The checkpoint (Llama-3.1-8B in BF16: 15 GiB) twice and 4 GiB spare, however sharded.
    assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {"sizeLimit": "34Gi"}}
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/models": "model-cache"}


def test_engine_config_comes_from_the_roles_config_map() -> None:
    objects = render(disaggregated_spec())
    config_maps = {c["metadata"]["name"]: c for c in of_kind(objects, "ConfigMap")}
    for role, deployment in deployments(objects).items():
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        name = volumes["engine-config"]["configMap"]["name"]
        assert name == f"llama-{role}-engine"
        assert "extra-llm-api-options.yaml" in config_maps[name]["data"]


@pytest.mark.parametrize("engine", ENGINES)
def test_pool_disruption_budget_allows_one_pod_down(engine: str) -> None:
    (budget,) = of_kind(render(spec_on(engine)), "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in budget["spec"]
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize("engine", ENGINES)
def test_rollout_never_drops_capacity_and_waits_for_cold_start(engine: str) -> None:
    deployment = render(spec_on(engine))[-1]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    (container,) = pod_spec(deployment)["containers"]
    startup = (
        container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
    )
    assert deployment["spec"]["progressDeadlineSeconds"] > startup


def _startup_budget_s(deployment: dict[str, Any]) -> int:
    probe = pod_spec(deployment)["containers"][0]["startupProbe"]
    return int(probe["failureThreshold"] * probe["periodSeconds"])


def test_the_startup_budget_covers_twice_the_estimated_cold_start() -> None:
    # An 8B model downloads and starts in about 294 s: the install's 1200 s stands.
    small = render(spec_on("vllm"))[-1]
    assert _startup_budget_s(small) == 1200
    # 70B bf16 on one GPU each of 4, from the hub: about 813 s, so 1627 s.
    large_spec = spec_on("vllm", model={"name": "llama-3.3-70b"}, parallelism={"tensor": 4})
    large = render(large_spec)[-1]
    estimate = plan(large_spec).cold_start
    assert estimate is not None
    assert _startup_budget_s(large) >= 2 * estimate.seconds > 1200
    assert large["spec"]["progressDeadlineSeconds"] > _startup_budget_s(large)
    # From a volume it skips the download (about 288 s): the install's budget again.
    cached = render(
        spec_on(
            "vllm",
            model={"name": "llama-3.3-70b", "source": "pvc://weights/llama-3.3-70b"},
            parallelism={"tensor": 4},
        )
    )[-1]
    assert _startup_budget_s(cached) == 1200


def test_a_rollout_without_a_spare_gpu_takes_replicas_down_as_the_spec_says() -> None:
    deployment = render(spec_on("vllm", rollout={"maxSurge": 0, "maxUnavailable": 1}))[-1]
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    with pytest.raises(ValueError, match="both 0 would never progress"):
        spec_on("vllm", rollout={"maxSurge": 0, "maxUnavailable": 0})


@pytest.mark.parametrize(
    ("engine", "flag"), [("vllm", "--shutdown-timeout"), ("sim", "--drain-timeout")]
)
def test_a_replica_going_away_drains_its_streams_as_long_as_the_spec_says(
    engine: str, flag: str
) -> None:
    def drained(spec: ModelDeploymentSpec) -> tuple[str, int]:
        pod = render(spec)[-1]["spec"]["template"]["spec"]
        args = pod["containers"][0]["args"]
        return args[args.index(flag) + 1], pod["terminationGracePeriodSeconds"]

    # The engine drains (vLLM's default, 0, aborts every stream on SIGTERM); the pod's grace
    # holds the preStop sleep, the drain and the exit.
    assert drained(spec_on(engine)) == ("50", 60)
    assert drained(spec_on(engine, rollout={"drainSeconds": 600})) == ("600", 610)
    with pytest.raises(ValueError, match=r"rollout\.drainSeconds"):
        spec_on(engine, rollout={"drainSeconds": -1})


@pytest.mark.parametrize(
    ("engine", "path"),
    [("vllm", "/metrics"), ("sim", "/metrics"), ("tensorrt-llm", "/prometheus/metrics")],
)
def test_pods_are_annotated_for_scraping(engine: str, path: str) -> None:
    annotations = render(spec_on(engine))[-1]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"
    assert annotations["prometheus.io/path"] == path


def test_services_are_headless_on_http() -> None:
    (service,) = of_kind(render(aggregated_spec()), "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_engine_refusals_surface_from_render() -> None:
    spec = spec_on("tensorrt-llm", precision={"weights": "int8", "method": "smoothquant"})
    with pytest.raises(UnsupportedSpecError, match=r"^precision\.method: smoothquant"):
        render(spec)


@pytest.mark.parametrize(
    ("changes", "rolls"),
    [
        ({"precision": {"weights": "fp8", "method": "fp8"}}, True),
        ({"precision": {"kvCache": "fp8"}}, True),
        ({"batching": {"maxSequences": 128}}, True),
        ({"engine": {"extraArgs": ["--enforce-eager"]}}, True),
        ({"gpu": {"type": "H200-141GB"}}, True),
        ({"replicas": 7}, False),
    ],
)
def test_spec_hash_changes_with_what_pods_run_not_with_replicas(
    changes: dict[str, Any], rolls: bool
) -> None:
    before = render(aggregated_spec())[-1]
    after = render(aggregated_spec(**changes))[-1]
    assert (template_hash(before) != template_hash(after)) is rolls
    assert (before["spec"]["template"] != after["spec"]["template"]) is rolls


def test_spec_hash_covers_config_files() -> None:
    # On TensorRT-LLM prefix caching lives only in the config file, not in the pod template.
    before = deployments(render(disaggregated_spec()))
    after = deployments(render(disaggregated_spec(prefixCaching=False)))
    for role in ("prefill", "decode"):
        assert pod_spec(before[role]) == pod_spec(after[role])
        assert template_hash(before[role]) != template_hash(after[role])


def test_spec_hash_ignores_replica_overrides() -> None:
    spec = disaggregated_spec()
    plain = deployments(render(spec))
    scaled = deployments(render(spec, replicas={Role.DECODE: 9, Role.PREFILL: 0}))
    assert scaled["decode"]["spec"]["replicas"] == 9
    assert scaled["prefill"]["spec"]["replicas"] == 0
    for role in ("prefill", "decode"):
        assert template_hash(plain[role]) == template_hash(scaled[role])
        assert plain[role]["spec"]["template"] == scaled[role]["spec"]["template"]


def test_spec_hash_is_stable_and_order_blind() -> None:
    assert spec_hash({"a": 1, "b": [1, 2]}) == spec_hash({"b": [1, 2], "a": 1})
    assert spec_hash({"a": 1}) != spec_hash({"a": 2})
    assert re.fullmatch(r"[0-9a-f]{16}", spec_hash({}))


def test_replicas_per_role() -> None:
    assert replicas_per_role(aggregated_spec()) == {Role.AGGREGATED: 2}
    assert replicas_per_role(disaggregated_spec()) == {Role.PREFILL: 2, Role.DECODE: 2}
    assert replicas_per_role(disaggregated_spec(), {Role.DECODE: 5}) == {
        Role.PREFILL: 2,
        Role.DECODE: 5,
    }
    with pytest.raises(ValueError, match="role prefill, which a aggregated deployment"):
        replicas_per_role(aggregated_spec(), {Role.PREFILL: 1})
    with pytest.raises(ValueError, match=">= 0"):
        replicas_per_role(aggregated_spec(), {Role.AGGREGATED: -1})


@pytest.mark.parametrize(
    "name",
    ["llama", "a" * 63, "model." + "x" * 80, "7b-model", "m" * 253],
)
def test_long_or_dotted_names_still_make_valid_child_names(name: str) -> None:
    md = model_deployment(aggregated_spec(), name=name)
    for obj in render_model_deployment(md):
        assert DNS_LABEL.match(obj["metadata"]["name"])
        assert len(obj["metadata"]["name"]) <= 63
        for value in obj["metadata"]["labels"].values():
            assert len(value) <= 63
        assert obj["metadata"]["ownerReferences"][0]["name"] == name


def test_names_keep_valid_inputs_and_separate_cleaned_ones() -> None:
    assert dns_label("llama-aggregated") == "llama-aggregated"
    assert dns_label("a.b") != dns_label("a-b")
    assert dns_label("7b").startswith("x-7b-")
    assert label_value("x" * 63) == "x" * 63
    assert len(label_value("x" * 64)) == 63
    assert label_value("x" * 64) != label_value("x" * 65)


def test_rendering_is_deterministic() -> None:
    assert render(disaggregated_spec()) == render(disaggregated_spec())


@pytest.mark.parametrize("engine", ["vllm", "sim"])
def test_an_engine_api_key_comes_from_its_secret_by_environment(engine: str) -> None:
    objects = render(spec_on(engine, engine={"apiKeySecret": "llama-engine-key"}))
    (container,) = pod_spec(deployments(objects)["aggregated"])["containers"]
    (key,) = [e for e in container.get("env", []) if e["name"] == "VLLM_API_KEY"]
    assert key["valueFrom"] == {"secretKeyRef": {"name": "llama-engine-key", "key": "api-key"}}
    # Never on the command line, where `ps` and the pod spec's args would show it.
    assert not any("llama-engine-key" in a or "api-key" in a for a in container.get("args", []))
    without = render(spec_on(engine))
    (plain,) = pod_spec(deployments(without)["aggregated"])["containers"]
    assert "VLLM_API_KEY" not in {e["name"] for e in plain.get("env", [])}


def test_the_model_cache_shrinks_with_the_checkpoint_s_precision() -> None:
    fp8 = render(spec_on("vllm", precision={"weights": "fp8"}))
    (cache,) = [
        v for d in deployments(fp8).values() for v in pod_spec(d)["volumes"]
        if v["name"] == "model-cache"
    ]  # fmt: skip
    # FP8 linear layers (7 GB) and 16-bit embeddings (2.1 GB): 8.5 GiB, twice, and 4 GiB.
    assert cache["emptyDir"]["sizeLimit"] == "21Gi"


SCHEDULING = {
    "nodeSelector": {"cloud.google.com/gke-nodepool": "h100-pool", GPU_PRODUCT_LABEL: "other"},
    "nodeAffinity": {
        "required": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
        ],
        "preferred": [
            {"weight": 20, "matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}
        ],
    },
    "tolerations": [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
    "priorityClassName": "inferfleet-interactive",
    "imagePullSecrets": ["registry-credentials"],
    "spreadAcross": "topology.kubernetes.io/zone",
}


@pytest.mark.parametrize("engine", ENGINES)
def test_scheduling_adds_to_what_the_gpus_need_and_never_replaces_it(engine: str) -> None:
    plain = pod_spec(deployments(render(spec_on(engine)))["aggregated"])
    [deployment] = of_kind(render(spec_on(engine, scheduling=SCHEDULING)), "Deployment")
    pod = pod_spec(deployment)
    # The GPU type's label keeps its value; the user's other labels are added.
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-nodepool": "h100-pool",
        GPU_PRODUCT_LABEL: plain["nodeSelector"][GPU_PRODUCT_LABEL],
    }
    assert pod["tolerations"] == [
        *plain["tolerations"],
        {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"},
    ]
    node_affinity = pod["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
        ]
    }
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {
            "weight": 20,
            "preference": {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]},
        }
    ]
    assert pod["priorityClassName"] == "inferfleet-interactive"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    [spread] = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    # Nothing the GPUs need moved: resources, security, the rest of the pod.
    assert pod["containers"] == plain["containers"]
    unchanged = {"nodeSelector", "tolerations", "affinity", "priorityClassName"}
    unchanged |= {"imagePullSecrets", "topologySpreadConstraints"}
    assert {k: v for k, v in pod.items() if k not in unchanged} == {
        k: v for k, v in plain.items() if k not in unchanged
    }
    # And the pods roll when the scheduling changes.
    assert template_hash(deployment) != template_hash(
        deployments(render(spec_on(engine)))["aggregated"]
    )


def test_an_install_without_a_gpu_node_label_selects_only_what_the_spec_does() -> None:
    bare = pod_spec(deployments(render(aggregated_spec(), placement=Placement(None)))["aggregated"])
    assert "nodeSelector" not in bare
    assert bare["tolerations"] == [
        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    ]
    cloud = {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    spec = aggregated_spec(scheduling={"nodeSelector": cloud})
    selected = pod_spec(deployments(render(spec, placement=Placement(None)))["aggregated"])
    assert selected["nodeSelector"] == cloud
    custom = pod_spec(
        deployments(render(spec, placement=Placement("example.com/gpu")))["aggregated"]
    )
    product = GpuCatalog.builtin()[spec.gpu.type].node_product_label
    assert custom["nodeSelector"] == cloud | {"example.com/gpu": product}


@pytest.mark.parametrize(
    ("overlay", "requests", "limits"),
    [
        ({"cpu": "12"}, {"cpu": "12"}, {}),
        ({"memory": "96Gi"}, {"memory": "96Gi"}, {"memory": "192Gi"}),
        ({"memory": "1.5Ti", "memoryLimit": "2Ti"}, {"memory": "1.5Ti"}, {"memory": "2Ti"}),
        # A limit alone above the planner's request leaves the request as planned.
        ({"memoryLimit": "4Ti"}, {}, {"memory": "4Ti"}),
        # A limit alone below it lowers the request to it: a request over its limit is refused.
        ({"memoryLimit": "8Gi"}, {"memory": "8Gi"}, {"memory": "8Gi"}),
    ],
)
def test_host_resources_overlay_the_planners_and_keep_the_gpus(
    overlay: dict[str, str], requests: dict[str, str], limits: dict[str, str]
) -> None:
    planned = pod_spec(deployments(render(aggregated_spec()))["aggregated"])["containers"][0]
    spec = aggregated_spec(scheduling={"resources": overlay})
    [container] = pod_spec(deployments(render(spec))["aggregated"])["containers"]
    assert container["resources"]["requests"] == planned["resources"]["requests"] | requests
    assert container["resources"]["limits"] == planned["resources"]["limits"] | limits
    assert "cpu" not in container["resources"]["limits"]
