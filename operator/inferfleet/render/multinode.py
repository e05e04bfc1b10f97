"""A role whose replica needs more GPUs than one node has: one LeaderWorkerSet (LWS,
`leaderworkerset.x-k8s.io/v1`, as kubernetes-sigs/lws v0.10.0 publishes it), one group per
replica, a pod per node: the leader serves and is scraped, the workers run their node's share
of the model (`engines.multinode`). `spec.replicas` is the count of groups, and the scale
subresource scales it as a Deployment's.

The group is recreated whole when any of its pods restarts (a torch.distributed group cannot
take a new member), the workers start beside the leader (the leader's API is ready only once
they have joined, so waiting for it would never end), and a rollout replaces one group at a
time without a spare one: a group is a node each, and spare nodes are the scarcest thing."""

from __future__ import annotations

import hashlib
from typing import Any, Final

from inferfleet.api.catalog import GpuCatalog
from inferfleet.api.model_deployment import ModelDeploymentSpec, Role
from inferfleet.engines import EngineContainer
from inferfleet.render.common import (
    LABEL_NAME,
    SPEC_HASH_ANNOTATION,
    Owner,
    dns_label,
    object_meta,
    spec_hash,
)
from inferfleet.render.model_deployment import (
    Placement,
    engine_labels,
    engine_pod_spec,
    engine_pod_template,
)

LWS_API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
LWS_KIND: Final = "LeaderWorkerSet"
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
"""On every pod of a group: "0" on its leader."""
ENGINE_WORKER_APP: Final = "inferfleet-engine-worker"
"""A worker's name label: not an engine's, so that neither the engine Service nor a router
looking for engine pods takes it for one that serves."""


_MAX_GROUP_NAME: Final = 50
"""A leader's pod is `<name>-<group>`, a worker's `<name>-<group>-<index>`, and a pod's name is
its hostname, a 63-character DNS label: room for six digits of each."""


def group_set_name(deployment: str, role: Role) -> str:
    """The LeaderWorkerSet's name, also the headless Service LWS creates for the group's
    pods to find their leader: not the engine Service's name, which picks ready leaders only
    (a leader is ready only once its workers have found it)."""
    name = dns_label(f"{deployment}-{role.value}-group")
    if len(name) <= _MAX_GROUP_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_GROUP_NAME - 9].rstrip('-')}-{digest}"


def leader_selector(selector: dict[str, str]) -> dict[str, str]:
    """What picks a group's serving pod out of the engine pods of a role."""
    return selector | {WORKER_INDEX_LABEL: "0"}


def engine_leader_worker_set(
    owner: Owner,
    spec: ModelDeploymentSpec,
    role: Role,
    members: tuple[EngineContainer, EngineContainer],
    replicas: int,
    *,
    nodes: int,
    placement: Placement,
    gpus: GpuCatalog,
) -> dict[str, Any]:
    """The LeaderWorkerSet of `role`: `replicas` groups of `nodes` pods, `members` the
    leader's and the workers' containers (`engines.multinode.group_members`)."""
    leader, worker = members
    labels = engine_labels(owner.name, role)
    worker_labels = labels | {LABEL_NAME: ENGINE_WORKER_APP}
    templates = {
        "leaderTemplate": engine_pod_template(
            labels, engine_pod_spec(owner, spec, role, leader, placement, gpus=gpus), leader
        ),
        "workerTemplate": engine_pod_template(
            worker_labels, engine_pod_spec(owner, spec, role, worker, placement, gpus=gpus), None
        ),
    }
    digest = spec_hash({"templates": templates, "configFiles": leader.config_files})
    for template in templates.values():
        annotations = template["metadata"]["annotations"] | {SPEC_HASH_ANNOTATION: digest}
        template["metadata"]["annotations"] = dict(sorted(annotations.items()))
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": object_meta(
            group_set_name(owner.name, role), owner, labels, {SPEC_HASH_ANNOTATION: digest}
        ),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                **templates,
            },
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }
