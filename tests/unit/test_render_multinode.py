"""A replica larger than one node: the LeaderWorkerSet the operator renders for it, admitted
by the schema LeaderWorkerSet publishes (v0.10.0), with vLLM's multi-node launch."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec, ParallelismSpec, Role
from inferfleet.api.rollout import RolloutSpec
from inferfleet.api.scheduling import SchedulingSpec
from inferfleet.devcluster.thirdparty import LEADER_WORKER_SET, file_sha256, published_crd
from inferfleet.engines import UnsupportedSpecError, build_engine_container
from inferfleet.engines.multinode import (
    DISTRIBUTED_PORT,
    SSH_CAPABILITIES,
    SSH_KEYS_DIR,
    SSH_KEYS_VOLUME,
    group_members,
)
from inferfleet.render import render_model_deployment
from inferfleet.render.multinode import (
    ENGINE_WORKER_APP,
    EXCLUSIVE_TOPOLOGY_ANNOTATION,
    GENERATED_DATA_ANNOTATION,
    SSH_KEYS,
    group_set_name,
)
from inferfleet.render.network import NetworkIsolation
from tests.unit.apiserver_emulation import admit
from tests.unit.multinode_fixtures import deployment, llama_405b_bf16, rendered


def lws_schema() -> dict[str, Any]:
    (version,) = published_crd(LEADER_WORKER_SET)["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def test_the_published_crd_is_the_file_as_released() -> None:
    assert file_sha256(LEADER_WORKER_SET) == LEADER_WORKER_SET.sha256
    assert published_crd(LEADER_WORKER_SET)["metadata"]["name"] == (
        "leaderworkersets.leaderworkerset.x-k8s.io"
    )


def test_a_405b_replica_on_two_h100_nodes_is_a_leader_worker_set_the_schema_admits() -> None:
    lws = rendered(llama_405b_bf16())
    admission = admit(lws, lws_schema())
    assert admission.admitted, admission.errors
    group = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], group["size"]) == (2, 2)
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    assert lws["metadata"]["name"] == group_set_name("llama-405b", Role.AGGREGATED)
    leader = group["leaderTemplate"]["spec"]["containers"][0]
    worker = group["workerTemplate"]["spec"]["containers"][0]
    for container in (leader, worker):
        # A node's share of the GPUs in each pod; the whole model's parallel sizes in each.
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        args = container["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert args[args.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--master-port") + 1] == str(DISTRIBUTED_PORT)
    assert leader["args"][leader["args"].index("--node-rank") + 1] == "0"
    assert worker["args"][worker["args"].index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
    assert "--headless" in worker["args"]
    assert "--headless" not in leader["args"]
    assert "readinessProbe" in leader
    assert "readinessProbe" not in worker
    assert "ports" not in worker
    worker_meta = group["workerTemplate"]["metadata"]
    assert worker_meta["labels"]["app.kubernetes.io/name"] == ENGINE_WORKER_APP
    assert "prometheus.io/scrape" not in worker_meta["annotations"]


def test_the_group_name_leaves_room_for_the_names_lws_derives_from_it() -> None:
    long = group_set_name("a" * 63, Role.AGGREGATED)
    assert long != group_set_name("a" * 62 + "b", Role.AGGREGATED)
    # The worker StatefulSet of group 999999 and the revision label on its pods (a 10-character
    # hash after the StatefulSet's name): a label value, at most 63 characters.
    assert len(f"{long}-999999-{'h' * 10}") <= 63
    # A worker pod's hostname.
    assert len(f"{long}-999999-99") <= 63


def test_the_sim_engine_over_several_nodes_is_refused_with_the_reason() -> None:
    spec = llama_405b_bf16("sim")
    engine = build_engine_container(spec, Role.AGGREGATED, model_name="m")
    with pytest.raises(UnsupportedSpecError, match="sim over several nodes"):
        group_members(spec, engine, 2)


def test_a_405b_replica_on_tensorrt_llm_is_one_mpi_world_over_the_group() -> None:
    """The leader runs mpirun over the group with the engine's command; each worker runs the
    SSH daemon mpirun starts its ranks through, with the capabilities that daemon needs and
    nothing to probe; both mount the keys Secret, which is rendered without its data."""
    objects = render_model_deployment(
        deployment(llama_405b_bf16("tensorrt-llm")), replicas={Role.AGGREGATED: 2}
    )
    (lws,) = [o for o in objects if o["kind"] == "LeaderWorkerSet"]
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    admission = admit(lws, lws_schema())
    assert admission.admitted, admission.errors
    assert secret["metadata"]["name"] == "llama-405b-mpi-ssh-u"
    assert secret["metadata"]["annotations"][GENERATED_DATA_ANNOTATION] == SSH_KEYS
    assert not {"data", "stringData"} & set(secret)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u"
    group = lws["spec"]["leaderWorkerTemplate"]
    pods = [group["leaderTemplate"]["spec"], group["workerTemplate"]["spec"]]
    leader, worker = (pod["containers"][0] for pod in pods)
    assert leader["command"][:2] == ["/bin/sh", "-c"]
    assert 'mpirun)" --allow-run-as-root' in leader["command"][2]
    args = leader["args"]
    assert args[0] == "trtllm-serve"
    assert args[args.index("--tp_size") + 1] == "8"
    assert args[args.index("--pp_size") + 1] == "2"
    assert "readinessProbe" in leader
    assert worker["command"][:2] == ["/bin/sh", "-c"]
    assert "sshd -D" in worker["command"][2]
    assert not {"args", "ports", "readinessProbe", "startupProbe"} & set(worker)
    assert worker["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": sorted(SSH_CAPABILITIES)
    }  # fmt: skip
    assert "add" not in leader["securityContext"]["capabilities"]
    held = {"leader": ["client", "host.pub"], "worker": ["host", "client.pub"]}
    for pod, container, role in zip(pods, (leader, worker), held, strict=True):
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        (keys,) = [v for v in pod["volumes"] if v["name"] == SSH_KEYS_VOLUME]
        assert keys["secret"]["secretName"] == secret["metadata"]["name"]
        # Only the keys each side uses: a worker holds no client key, the leader no host key.
        assert [item["key"] for item in keys["secret"]["items"]] == held[role]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == SSH_KEYS_VOLUME]
        assert (mount["mountPath"], mount["readOnly"]) == (SSH_KEYS_DIR, True)
    assert {e["name"] for e in leader["env"]} == {e["name"] for e in worker["env"]}
    # The kubelet expands `$(NAME)` and `$$` in a command; the scripts' own `$(...)` are
    # command substitutions and arithmetic, which it must leave alone.
    for script in (leader["command"][2], worker["command"][2]):
        assert not re.search(r"\$\$|\$\([A-Za-z_][A-Za-z0-9_]*\)", script)


def test_a_vllm_group_needs_no_keys() -> None:
    objects = render_model_deployment(deployment(llama_405b_bf16()))
    assert "Secret" not in [o["kind"] for o in objects]


def test_a_replica_over_two_nodes_is_served_by_its_leaders() -> None:
    """The role's objects: the engine Service and the router find leaders only (a worker
    serves nothing), the disruption budget counts every pod of the groups (one pod down is a
    group down), and no Deployment."""
    objects = render_model_deployment(deployment(llama_405b_bf16()), isolation=NetworkIsolation())
    assert [o["kind"] for o in objects] == [
        "NetworkPolicy", "Service", "PodDisruptionBudget", "LeaderWorkerSet",
    ]  # fmt: skip
    service, budget, lws = objects[1:]
    selector = service["spec"]["selector"]
    group = lws["spec"]["leaderWorkerTemplate"]
    leader_labels = group["leaderTemplate"]["metadata"]["labels"]
    worker_labels = group["workerTemplate"]["metadata"]["labels"]
    assert selector.items() <= leader_labels.items()
    assert not selector.items() <= worker_labels.items()
    budget_selector = budget["spec"]["selector"]["matchLabels"]
    assert budget_selector.items() <= leader_labels.items()
    assert budget_selector.items() <= worker_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    # NetworkPolicies select leaders and workers: the workers reach the leader's store.
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for labels in (leader_labels, worker_labels):
        assert selects(policy["spec"]["podSelector"], labels)
        assert selects(policy["spec"]["ingress"][0]["from"][0]["podSelector"], labels)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict on `labels` (matchLabels and In expressions)."""
    matched = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        matched = matched and labels.get(expression["key"]) in expression["values"]
    return matched


def test_the_deployments_replicas_are_the_groups() -> None:
    spec = llama_405b_bf16()
    assert rendered(spec, replicas=3)["spec"]["replicas"] == 3
    lws = next(
        o for o in render_model_deployment(deployment(spec)) if o["kind"] == "LeaderWorkerSet"
    )
    assert lws["spec"]["replicas"] == spec.replicas


def test_a_replica_that_leaves_part_of_a_node_is_not_rendered() -> None:
    # The API refuses it; an object stored before that rule still must not render.
    spec = llama_405b_bf16()
    odd = spec.model_copy(
        update={"parallelism": ParallelismSpec.model_construct(tensor=4, pipeline=3)}
    )
    with pytest.raises(UnsupportedSpecError, match="do not fill whole H100-80GB nodes") as raised:
        render_model_deployment(deployment(odd))
    assert raised.value.field_path == "parallelism"


def test_the_install_catalog_says_how_many_nodes_a_replica_spans() -> None:
    """Nodes of four H100s: a replica of eight is a group of two pods of four, and the same
    spec on the built-in catalog's eight-GPU nodes is one pod."""
    spec = ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.3-70b", "source": "hf://meta-llama/Llama-3.3-70B-Instruct"},
            "engine": {"name": "vllm"},
            "gpu": {"type": "H100-80GB"},
            "parallelism": {"tensor": 4, "pipeline": 2},
        }
    )
    four = GpuCatalog.builtin().with_overrides({"H100-80GB": {"gpusPerNode": 4}})
    lws = next(
        o
        for o in render_model_deployment(deployment(spec), gpus=four)
        if o["kind"] == "LeaderWorkerSet"
    )
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2
    for template in ("leaderTemplate", "workerTemplate"):
        (container,) = group[template]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    kinds = {o["kind"] for o in render_model_deployment(deployment(spec))}
    assert "Deployment" in kinds
    assert "LeaderWorkerSet" not in kinds


def test_a_group_topology_keeps_each_replica_in_one_domain_and_rolls_the_groups() -> None:
    """LWS's exclusive topology: each value of the label holds one group whole. A change of
    it changes the groups' pod template hash, so LWS replaces them where they stand."""
    spec = llama_405b_bf16()
    placed = spec.model_copy(
        update={"scheduling": SchedulingSpec.model_validate({"groupTopology": "example.com/rack"})}
    )
    before, after = rendered(spec), rendered(placed)
    assert after["metadata"]["annotations"][EXCLUSIVE_TOPOLOGY_ANNOTATION] == "example.com/rack"
    assert EXCLUSIVE_TOPOLOGY_ANNOTATION not in before["metadata"]["annotations"]
    admission = admit(after, lws_schema())
    assert admission.admitted, admission.errors

    def template_hash(lws: dict[str, Any]) -> str:
        template = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        return str(template["metadata"]["annotations"]["inferfleet.io/spec-hash"])

    assert template_hash(before) != template_hash(after)


def test_spread_across_spreads_the_groups_by_their_leaders_only() -> None:
    spec = llama_405b_bf16().model_copy(
        update={
            "scheduling": SchedulingSpec.model_validate(
                {"spreadAcross": "topology.kubernetes.io/zone"}
            )
        }
    )
    group = rendered(spec)["spec"]["leaderWorkerTemplate"]
    (spread,) = group["leaderTemplate"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert "topologySpreadConstraints" not in group["workerTemplate"]["spec"]


def test_groups_roll_one_down_at_a_time_unless_the_spec_says_otherwise() -> None:
    default = rendered(llama_405b_bf16())["spec"]["rolloutStrategy"]
    assert default["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
    spec = llama_405b_bf16().model_copy(
        update={"rollout": RolloutSpec(max_surge=1, max_unavailable=0)}
    )
    surged = rendered(spec)
    assert surged["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxUnavailable": 0,
        "maxSurge": 1,
    }
    assert admit(surged, lws_schema()).admitted
