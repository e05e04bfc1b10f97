"""A replica larger than one node: the LeaderWorkerSet the operator renders for it, admitted
by the schema LeaderWorkerSet publishes (v0.10.0), with vLLM's multi-node launch."""

from __future__ import annotations

from typing import Any

import pytest

from inferfleet.api.model_deployment import Role
from inferfleet.devcluster.thirdparty import LEADER_WORKER_SET, file_sha256, published_crd
from inferfleet.engines import UnsupportedSpecError, build_engine_container
from inferfleet.engines.multinode import DISTRIBUTED_PORT, group_members
from inferfleet.render.multinode import (
    ENGINE_WORKER_APP,
    group_set_name,
)
from tests.unit.apiserver_emulation import admit
from tests.unit.multinode_fixtures import llama_405b_bf16, rendered


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


def test_the_group_name_leaves_room_for_pod_hostnames() -> None:
    long = group_set_name("a" * 63, Role.AGGREGATED)
    assert len(long) <= 50
    assert long != group_set_name("a" * 62 + "b", Role.AGGREGATED)
    assert len(f"{long}-999999-99") <= 63


def test_tensorrt_llm_over_several_nodes_is_refused_with_the_reason() -> None:
    spec = llama_405b_bf16("tensorrt-llm")
    engine = build_engine_container(spec, Role.AGGREGATED, model_name="m")
    with pytest.raises(UnsupportedSpecError, match="tensorrt-llm over several nodes"):
        group_members(spec, engine, 2)
