"""A replica larger than one node, as one LeaderWorkerSet group (leaderworkerset.x-k8s.io/v1):
the leader's engine container and the workers'.

vLLM 0.33.0 runs one model over several nodes without Ray (checked in the release's source):
every pod runs `vllm serve` with the same parallel sizes and `--nnodes` (the group's size),
`--master-addr`/`--master-port` (where the leader's torch.distributed store listens; 29501 is
vLLM's default) and `--node-rank` (vllm/engine/arg_utils.py, vllm/config/parallel.py: world
size over nodes must divide evenly, ranks below nodes); a rank above 0 with `--headless` runs
its node's model workers and serves no API (vllm/entrypoints/cli/serve.py, `run_headless`).
LeaderWorkerSet (v0.10.0) puts the group's size, the leader's address and each pod's index in
every container's environment (`LWS_GROUP_SIZE`, `LWS_LEADER_ADDRESS`, `LWS_WORKER_INDEX`),
which the kubelet substitutes into the arguments.

TensorRT-LLM runs a model over nodes as one MPI world (`mpirun ... trtllm-llmapi-launch
trtllm-serve`), launched by the leader into the workers' pods: not rendered here."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any, Final

from inferfleet.api.model_deployment import EngineName, ModelDeploymentSpec
from inferfleet.engines.common import (
    SHM_VOLUME,
    EngineContainer,
    UnsupportedSpecError,
    gpu_volumes,
)

GROUP_SIZE_ENV: Final = "LWS_GROUP_SIZE"
LEADER_ADDRESS_ENV: Final = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV: Final = "LWS_WORKER_INDEX"
DISTRIBUTED_PORT: Final = 29501
DISTRIBUTED_PORT_NAME: Final = "dist"
_PROBES: Final = ("startupProbe", "readinessProbe", "livenessProbe")


def group_members(
    spec: ModelDeploymentSpec, engine: EngineContainer, nodes: int
) -> tuple[EngineContainer, EngineContainer]:
    """The leader's and each worker's container of one replica of `engine` (built for the
    whole replica) over `nodes` nodes, each pod with its node's share of the GPUs.

    Raises `UnsupportedSpecError` for an engine without such a launch here."""
    if spec.engine.name != EngineName.VLLM:
        raise UnsupportedSpecError(
            "engine.name",
            f"a replica of {spec.parallelism.gpus_per_replica} GPUs spans {nodes} nodes, and "
            f"{spec.engine.name.value} over several nodes is not supported; use vllm",
        )
    if nodes < 2 or engine.gpus % nodes:
        raise ValueError(f"{engine.gpus} GPUs do not split evenly over {nodes} nodes")
    gpus = engine.gpus // nodes
    # /dev/shm is sized by the GPUs of the pod, not of the replica.
    (shm,) = [v for v in gpu_volumes(gpus)[0] if v["name"] == SHM_VOLUME]
    volumes = [shm if v["name"] == SHM_VOLUME else v for v in engine.volumes]
    group = [
        "--nnodes", f"$({GROUP_SIZE_ENV})",
        "--master-addr", f"$({LEADER_ADDRESS_ENV})",
        "--master-port", str(DISTRIBUTED_PORT),
    ]  # fmt: skip
    container = engine.container
    leader: dict[str, Any] = {
        **container,
        "args": [*container["args"], *group, "--node-rank", "0"],
        "ports": [
            *container["ports"],
            {"name": DISTRIBUTED_PORT_NAME, "containerPort": DISTRIBUTED_PORT, "protocol": "TCP"},
        ],
    }
    # A headless worker serves nothing to probe: the group is ready when its leader is.
    worker = {k: copy.deepcopy(v) for k, v in container.items() if k not in ("ports", *_PROBES)}
    rank = ["--node-rank", f"$({WORKER_INDEX_ENV})", "--headless"]
    worker["args"] = [*container["args"], *group, *rank]
    return (
        replace(engine, container=leader, volumes=volumes, gpus=gpus),
        replace(engine, container=worker, volumes=copy.deepcopy(volumes), gpus=gpus),
    )
