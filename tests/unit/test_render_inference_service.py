"""Rendering an InferenceService: the router's Deployment, Service and disruption budget."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment
from inferfleet.render import (
    DEFAULT_ROUTER_IMAGE,
    MissingReferenceError,
    render_inference_service,
    render_model_deployment,
    router_service_name,
)
from inferfleet.render.inference_service import TENANT_KEYS_DIR
from inferfleet.router.config import RouterConfig, parse_backend
from inferfleet.router.tenants import TenantSpec, parse_tenant
from tests.unit.golden import check_golden
from tests.unit.golden.specs import (
    AGGREGATED_EXAMPLE,
    DISAGGREGATED_EXAMPLE,
    aggregated_spec,
    disaggregated_spec,
    example_objects,
    model_deployment,
)

Objects = list[dict[str, Any]]


def service(deployments: list[dict[str, Any]], **spec: Any) -> InferenceService:
    return InferenceService.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "serving", "uid": "uid-chat"},
            "spec": {"deployments": deployments, "slo": {"ttftP95Ms": 800}} | spec,
        }
    )


def router(objects: Objects) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment


def router_args(objects: Objects) -> list[str]:
    args: list[str] = router(objects)["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def backends(args: list[str]) -> list[dict[str, str]]:
    values = [args[i + 1] for i, a in enumerate(args) if a == "--backend"]
    return [dict(pair.split("=", 1) for pair in value.split(",")) for value in values]


@pytest.mark.parametrize(
    ("name", "file"),
    [
        ("llama-3.1-8b-aggregated-vllm-router", AGGREGATED_EXAMPLE),
        ("llama-3.3-70b-fp8-disaggregated-trtllm-router", DISAGGREGATED_EXAMPLE),
    ],
)
def test_examples_render_as_golden(name: str, file: str) -> None:
    md, isvc = example_objects(file)
    check_golden(f"render/{name}.yaml", render_inference_service(isvc, {md.metadata["name"]: md}))  # type: ignore[dict-item]


def test_router_objects_and_endpoint() -> None:
    md, isvc = example_objects(AGGREGATED_EXAMPLE)
    objects = render_inference_service(isvc, {"llama-3-1-8b": md})
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "chat-router"),
        ("Role", "chat-router"),
        ("RoleBinding", "chat-router"),
        ("Service", "chat"),
        ("PodDisruptionBudget", "chat-router"),
        ("Deployment", "chat-router"),
    ]
    (endpoint,) = [o for o in objects if o["kind"] == "Service"]
    assert endpoint["spec"]["type"] == "ClusterIP"
    assert endpoint["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    assert router_service_name("chat") == "chat"
    for obj in objects:
        assert obj["metadata"]["namespace"] == "serving"
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "inferfleet.io/v1alpha1",
                "kind": "InferenceService",
                "name": "chat",
                "uid": "uid-isvc-1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "inferfleet"
        assert obj["metadata"]["labels"]["inferfleet.io/inference-service"] == "chat"


def test_router_pods_two_replicas_no_gpu_non_root() -> None:
    md = model_deployment(aggregated_spec())
    deployment = router(render_inference_service(service([{"name": "llama"}]), {"llama": md}))
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == DEFAULT_ROUTER_IMAGE == "inferfleet/router:0.1.0"
    assert container["command"] == ["inferfleet", "router"]
    assert "nvidia.com/gpu" not in str(container.get("resources"))
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["serviceAccountName"] == "chat-router"
    assert deployment["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "inferfleet-router",
        "inferfleet.io/inference-service": "chat",
    }


def test_the_install_names_the_routers_image() -> None:
    md = model_deployment(aggregated_spec())
    objects = render_inference_service(
        service([{"name": "llama"}]), {"llama": md}, router_image="registry.example.com/r:1.2.3"
    )
    (container,) = router(objects)["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/r:1.2.3"


def test_router_args_list_backends_per_role_and_the_slo() -> None:
    deployments = {
        "llama": model_deployment(aggregated_spec(), name="llama"),
        "llama-pd": model_deployment(disaggregated_spec(), name="llama-pd"),
    }
    isvc = service(
        [{"name": "llama-pd", "weight": 90}, {"name": "llama", "weight": 10}],
        slo={"ttftP95Ms": 1500, "tpotP95Ms": 62.5, "attainmentTarget": 0.95},
    )
    args = router_args(render_inference_service(isvc, deployments))
    assert backends(args) == [
        {"deployment": "llama", "role": "aggregated", "engine": "vllm", "weight": "10",
         "model": "llama-3.1-8b", "context": "32768", "seqs": "256",
         "service": "llama-aggregated", "port": "8000"},
        {"deployment": "llama-pd", "role": "prefill", "engine": "tensorrt-llm", "weight": "90",
         "model": "llama-3.3-70b", "context": "16384", "seqs": "256",
         "service": "llama-pd-prefill", "port": "8000"},
        {"deployment": "llama-pd", "role": "decode", "engine": "tensorrt-llm", "weight": "90",
         "model": "llama-3.3-70b", "context": "16384", "seqs": "256",
         "service": "llama-pd-decode", "port": "8000"},
    ]  # fmt: skip
    assert args[:8] == [
        "--service", "chat", "--port", "8000", "--admin-port", "8001",
        "--namespace", "$(POD_NAMESPACE)",
    ]  # fmt: skip
    assert args[-6:] == [
        "--slo-ttft-p95-ms", "1500", "--slo-tpot-p95-ms", "62.5",
        "--slo-attainment-target", "0.95",
    ]  # fmt: skip


def test_a_router_going_away_drains_as_long_as_its_slowest_deployment() -> None:
    deployments = {
        "llama": model_deployment(aggregated_spec(rollout={"drainSeconds": 300}), name="llama"),
        "llama-pd": model_deployment(disaggregated_spec(), name="llama-pd"),
    }
    both = render_inference_service(service([{"name": "llama-pd"}, {"name": "llama"}]), deployments)
    args = router_args(both)
    assert args[args.index("--drain-timeout") + 1] == "300"
    assert router(both)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 310
    alone = render_inference_service(service([{"name": "llama-pd"}]), deployments)
    assert router(alone)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60


def test_backend_services_are_the_ones_rendered_for_the_deployments() -> None:
    md = model_deployment(disaggregated_spec(), name="llama-pd")
    engine_services = {
        o["metadata"]["name"] for o in render_model_deployment(md) if o["kind"] == "Service"
    }
    args = router_args(render_inference_service(service([{"name": "llama-pd"}]), {"llama-pd": md}))
    assert {b["service"] for b in backends(args)} == engine_services


def test_an_slo_target_left_out_is_not_passed() -> None:
    md = model_deployment(aggregated_spec())
    args = router_args(render_inference_service(service([{"name": "llama"}]), {"llama": md}))
    assert "--slo-tpot-p95-ms" not in args
    assert args[args.index("--slo-ttft-p95-ms") + 1] == "800"


@pytest.mark.parametrize(
    ("spec", "autoscaling", "wake"),
    [
        (aggregated_spec, {"policy": "goodput", "aggregated": {"minReplicas": 0}}, True),
        (aggregated_spec, {"policy": "goodput", "wakeTimeoutSeconds": 900}, False),
        (aggregated_spec, {"policy": "none", "aggregated": {"minReplicas": 0}}, False),
        (
            disaggregated_spec,
            {"policy": "goodput", "prefill": {"minReplicas": 0}, "decode": {"minReplicas": 0}},
            True,
        ),
        # The aggregated bounds say nothing of a disaggregated deployment's pools.
        (disaggregated_spec, {"policy": "goodput", "aggregated": {"minReplicas": 0}}, False),
    ],
    ids=["aggregated", "min-one", "not-autoscaled", "disaggregated", "bounds-of-another-topology"],
)
def test_a_router_holds_requests_for_a_wake_only_where_its_service_may_go_to_zero(
    spec: Any, autoscaling: dict[str, Any], wake: bool
) -> None:
    md = model_deployment(spec(), name="llama")
    isvc = service([{"name": "llama"}], autoscaling=autoscaling | {"wakeTimeoutSeconds": 900})
    objects = render_inference_service(isvc, {"llama": md})
    args = router_args(objects)
    (role,) = [o for o in objects if o["kind"] == "Role"]
    pushed_to = [o for o in objects if o["kind"] == "ConfigMap"]
    if wake:
        assert args[args.index("--wake-timeout") + 1] == "900"
        assert args[args.index("--wake-config-map") + 1] == "chat-router-wake"
        # The router may write that one ConfigMap, by name, and no other.
        assert [o["metadata"]["name"] for o in pushed_to] == ["chat-router-wake"]
        assert "data" not in pushed_to[0]
        assert role["rules"][1] == {
            "apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["chat-router-wake"], "verbs": ["get", "patch"],
        }  # fmt: skip
    else:
        assert "--wake-timeout" not in args
        assert "--wake-config-map" not in args
        assert pushed_to == []
        assert len(role["rules"]) == 1


@pytest.mark.parametrize(
    ("available", "missing"),
    [
        ({}, ["a", "b"]),
        ({"a": "serving"}, ["b"]),
        ({"a": "serving", "b": "other-namespace"}, ["b"]),
    ],
)
def test_missing_or_foreign_deployments_are_reported(
    available: dict[str, str], missing: list[str]
) -> None:
    deployments: dict[str, ModelDeployment] = {
        name: model_deployment(aggregated_spec(), name=name, namespace=namespace)
        for name, namespace in available.items()
    }
    with pytest.raises(MissingReferenceError) as raised:
        render_inference_service(service([{"name": "a"}, {"name": "b"}]), deployments)
    assert raised.value.missing == tuple(missing)
    assert str(raised.value) == (
        f"InferenceService chat: ModelDeployment not found in namespace serving: "
        f"{', '.join(missing)}"
    )
    assert isinstance(raised.value, LookupError)


def test_router_spec_hash_follows_the_backends() -> None:
    md = model_deployment(aggregated_spec())
    one = router(render_inference_service(service([{"name": "llama"}]), {"llama": md}))
    other = router(
        render_inference_service(service([{"name": "llama", "weight": 5}]), {"llama": md})
    )
    key = "inferfleet.io/spec-hash"
    assert one["metadata"]["annotations"][key] != other["metadata"]["annotations"][key]
    again = router(render_inference_service(service([{"name": "llama"}]), {"llama": md}))
    assert one == again


def test_the_router_may_read_endpointslices_of_its_namespace_and_nothing_else() -> None:
    md, isvc = example_objects(AGGREGATED_EXAMPLE)
    objects = {o["kind"]: o for o in render_inference_service(isvc, {"llama-3-1-8b": md})}
    assert objects["Role"]["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "chat-router",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-router", "namespace": "serving"}
    ]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]


def test_tenants_reach_the_router_as_mounted_key_secrets_and_flags() -> None:
    """Each tenant's Secret is mounted where its `--tenant` flag says its keys are, readable
    by the router's group only; the flags parse as the router parses them."""
    isvc = service(
        [{"name": "llama"}],
        slo={"ttftP95Ms": 500},
        tenants=[
            {"name": "search", "apiKeySecret": "search-keys", "models": ["llama-3.1-8b"],
             "limits": {"requestsPerSecond": 2.5, "tokensPerMinute": 60000,
                        "maxConcurrentRequests": 8}},
            {"name": "batch", "apiKeySecret": "batch-keys"},
        ],
    )  # fmt: skip
    objects = render_inference_service(isvc, {"llama": model_deployment(aggregated_spec())})
    deployment = router(objects)
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    flags = [parse_tenant(args[i + 1]) for i, a in enumerate(args) if a == "--tenant"]
    assert flags == [
        TenantSpec("search", f"{TENANT_KEYS_DIR}/search", 2.5, 60000.0, 8, ("llama-3.1-8b",)),
        TenantSpec("batch", f"{TENANT_KEYS_DIR}/batch"),
    ]
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    for flag in flags:
        mount = mounts[flag.keys]
        assert mount["readOnly"] is True
        assert secrets[mount["name"]]["defaultMode"] == 0o440
    assert [s["secretName"] for s in secrets.values()] == ["search-keys", "batch-keys"]
    # A key rotation changes the Secret only: nothing here names a key.
    no_tenants = render_inference_service(
        service([{"name": "llama"}], slo={"ttftP95Ms": 500}),
        {"llama": model_deployment(aggregated_spec())},
    )
    assert "--tenant" not in router_args(no_tenants)


def test_the_router_presents_each_deployment_s_engine_key_from_a_mounted_secret() -> None:
    keyed = model_deployment(
        aggregated_spec(engine={"name": "vllm", "apiKeySecret": "llama-engine-key"}),
        name="llama",
    )
    plain = model_deployment(disaggregated_spec(), name="llama-pd")
    isvc = service([{"name": "llama"}, {"name": "llama-pd"}])
    objects = render_inference_service(isvc, {"llama": keyed, "llama-pd": plain})
    by_deployment = {b["deployment"]: b for b in backends(router_args(objects))}
    assert by_deployment["llama"]["keyfile"] == "/etc/inferfleet/engine-keys/llama/api-key"
    assert "keyfile" not in by_deployment["llama-pd"]
    pod = router(objects)["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"].startswith("engine-key")]
    assert volume["secret"] == {"secretName": "llama-engine-key", "defaultMode": 0o440}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/inferfleet/engine-keys/llama", True)


def test_a_deployments_adapters_are_served_names_of_its_backend() -> None:
    md, isvc = example_objects("llama-3.1-8b-lora-vllm.yaml")
    objects = render_inference_service(isvc, {str(md.metadata["name"]): md})
    [router] = [o for o in objects if o["kind"] == "Deployment"]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    [backend] = [args[i + 1] for i, arg in enumerate(args) if arg == "--backend"]
    parsed = parse_backend(backend)
    assert parsed.model == "llama-3.1-8b"
    assert parsed.adapters == ("sql-assistant", "support-triage")
    config = RouterConfig(service="fine-tunes", backends=(parsed,))
    assert config.serving("support-triage") == ["llama-3-1-8b-lora"]
    assert config.models() == ["llama-3.1-8b", "sql-assistant", "support-triage"]
