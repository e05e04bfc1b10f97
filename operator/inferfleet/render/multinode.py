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
from collections.abc import Mapping
from typing import Any, Final

from inferfleet.api.model_deployment import Role
from inferfleet.render.common import (
    LABEL_MODEL_DEPLOYMENT,
    LABEL_ROLE,
    SPEC_HASH_ANNOTATION,
    Owner,
    dns_label,
    label_value,
    object_meta,
    pod_disruption_budget,
    spec_hash,
)

LWS_API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
LWS_KIND: Final = "LeaderWorkerSet"
LWS_SUPPORTED: Final = "v0.6.0 or later; v0.10.0's schema is the one checked here"
"""The LWS releases whose API this renders against: `LWS_WORKER_INDEX` in the pods'
environment came with v0.6.0, everything else used here before it."""
EXCLUSIVE_TOPOLOGY_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"
"""LWS's annotation (since v0.6.0): the node label whose values hold one group each, whole."""
ENGINE_WORKER_APP: Final = "inferfleet-engine-worker"
"""A worker's name label: not an engine's, so that neither the engine Service nor a router
looking for engine pods takes it for one that serves."""


GENERATED_DATA_ANNOTATION: Final = "inferfleet.io/generated-data"
"""On a Secret rendered without its data: what the operator generates into it when it creates
it (`SSH_KEYS`), never to be applied again (its content is the operator's, once)."""
SSH_KEYS: Final = "mpi-ssh-keys"


def ssh_keys_secret_name(owner: Owner) -> str:
    """Named for the ModelDeployment's uid as well as its name: one deleted and created again
    under its name gets new keys at once, not the Secret of the one before (which the garbage
    collector removes a moment later, and which the operator, never reading Secrets, could not
    tell from its own)."""
    suffix = f"-{owner.uid[:8]}" if owner.uid else ""
    return dns_label(f"{owner.name}-mpi-ssh{suffix}")


def ssh_keys_secret(owner: Owner, labels: dict[str, str]) -> dict[str, Any]:
    """The Secret of a ModelDeployment's SSH keys (`engines.multinode`), as rendered: no data,
    which the operator generates when it creates it (a renderer is a pure function; keys are
    random). Owned by the ModelDeployment, so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(
            ssh_keys_secret_name(owner), owner, labels, {GENERATED_DATA_ANNOTATION: SSH_KEYS}
        ),
        "type": "Opaque",
    }


_MAX_GROUP_NAME: Final = 45
"""LWS names each group's worker StatefulSet `<name>-<group>`, and the StatefulSet controller
labels its pods `controller-revision-hash: <statefulset>-<hash of up to 10 characters>`, a label
value of at most 63: room for a six-digit group index. (A worker pod, `<name>-<group>-<index>`,
is a 63-character hostname at most too.)"""


def group_set_name(deployment: str, role: Role) -> str:
    """The LeaderWorkerSet's name, also the headless Service LWS creates for the group's
    pods to find their leader: not the engine Service's name, which picks ready leaders only
    (a leader is ready only once its workers have found it)."""
    name = dns_label(f"{deployment}-{role.value}-group")
    if len(name) <= _MAX_GROUP_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_GROUP_NAME - 9].rstrip('-')}-{digest}"


def group_selector(deployment: str, role: Role) -> dict[str, str]:
    """Every pod of a role's groups, leaders and workers."""
    return {LABEL_MODEL_DEPLOYMENT: label_value(deployment), LABEL_ROLE: role.value}


def group_disruption_budget(
    owner: Owner, name: str, role: Role, labels: dict[str, str]
) -> dict[str, Any]:
    """One pod of the role's groups voluntarily down at a time: a group loses all its pods
    with any one of them, so a drain takes one group at a time, not one pod of each."""
    return pod_disruption_budget(name, owner, labels, group_selector(owner.name, role))


def engine_leader_worker_set(
    owner: Owner,
    role: Role,
    labels: dict[str, str],
    templates: tuple[dict[str, Any], dict[str, Any]],
    replicas: int,
    *,
    nodes: int,
    config_files: Mapping[str, str],
    group_topology: str | None = None,
    rollout: tuple[int, int] = (0, 1),
) -> dict[str, Any]:
    """The LeaderWorkerSet of `role`: `replicas` groups of `nodes` pods, from the leader's and
    the workers' pod templates (`engines.multinode.group_members` builds their containers).
    `group_topology`: a node label each of whose values holds one group whole, and only one
    (LWS's exclusive topology: its controller gives the pods the affinities). `rollout`: the
    groups surged and taken down at a time (default: none surged, one down: a spare group of
    several nodes is rarely free)."""
    leader, worker = templates
    named = {"leaderTemplate": leader, "workerTemplate": worker}
    # The placement is part of what the groups run: a change of it rolls them.
    placement = {"groupTopology": group_topology} if group_topology else {}
    digest = spec_hash({"templates": named, "configFiles": dict(config_files)} | placement)
    for template in named.values():
        annotations = template["metadata"]["annotations"] | {SPEC_HASH_ANNOTATION: digest}
        template["metadata"]["annotations"] = dict(sorted(annotations.items()))
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": object_meta(
            group_set_name(owner.name, role),
            owner,
            labels,
            {SPEC_HASH_ANNOTATION: digest}
            | ({EXCLUSIVE_TOPOLOGY_ANNOTATION: group_topology} if group_topology else {}),
        ),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                **named,
            },
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxUnavailable": rollout[1],
                    "maxSurge": rollout[0],
                },
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }
