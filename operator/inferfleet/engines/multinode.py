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

TensorRT-LLM (1.2.1) runs a model over nodes as one MPI world: `mpirun` starts a rank per GPU
on every node, each under `trtllm-llmapi-launch`, which runs the command (`trtllm-serve`) on
rank 0 and makes the other ranks its workers (tensorrt_llm/llmapi/trtllm-llmapi-launch; the
multi-node serving docs launch it so under `srun` or `mpirun`). Open MPI starts its daemon on
each remote node through its rsh agent, ssh by default: each worker pod runs an SSH daemon on
`SSH_PORT` and the leader runs `mpirun` once every worker's daemon answers. The keys come
from a Secret the operator generates per ModelDeployment (`SSH_KEYS_*`): a client key whose
public half is the only one a worker's daemon accepts, and a host key every worker serves,
which the leader checks (no host key is taken on trust). Worker addresses follow from LWS's
naming: pod `<group set>-<group>-<index>` beside the leader `<group set>-<group>`, under one
subdomain, so the leader's address gives the others. A process started by the daemon has the
daemon's environment, not the pod's: `mpirun -x` passes the leader's on, but for the variables
of its own pod (its host name, LWS's index and address). Each pod mounts only the keys it uses.

The worker's daemon needs three capabilities back (SETUID, SETGID and SYS_CHROOT, for its
privilege separation; all three within the Pod Security Standards' baseline), and the image an
SSH server (NVIDIA's release image has the client `mpirun` uses, not the server:
runtime_images/tensorrt-llm adds it)."""

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
    spec: ModelDeploymentSpec,
    engine: EngineContainer,
    nodes: int,
    *,
    ssh_keys_secret: str | None = None,
) -> tuple[EngineContainer, EngineContainer]:
    """The leader's and each worker's container of one replica of `engine` (built for the
    whole replica) over `nodes` nodes, each pod with its node's share of the GPUs.
    `ssh_keys_secret`: the Secret of the group's SSH keys (`needs_ssh_keys`).

    Raises `UnsupportedSpecError` for an engine without such a launch here."""
    if spec.engine.name not in (EngineName.VLLM, EngineName.TENSORRT_LLM):
        raise UnsupportedSpecError(
            "engine.name",
            f"a replica of {spec.parallelism.gpus_per_replica} GPUs spans {nodes} nodes, and "
            f"{spec.engine.name.value} over several nodes is not supported; use vllm or "
            "tensorrt-llm",
        )
    if nodes < 2 or engine.gpus % nodes:
        raise ValueError(f"{engine.gpus} GPUs do not split evenly over {nodes} nodes")
    gpus = engine.gpus // nodes
    # /dev/shm is sized by the GPUs of the pod, not of the replica.
    (shm,) = [v for v in gpu_volumes(gpus)[0] if v["name"] == SHM_VOLUME]
    volumes = [shm if v["name"] == SHM_VOLUME else v for v in engine.volumes]
    if spec.engine.name == EngineName.TENSORRT_LLM:
        if ssh_keys_secret is None:
            raise ValueError("a TensorRT-LLM group needs the Secret of its SSH keys")
        return _mpi_members(engine, gpus, volumes, ssh_keys_secret)
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


def needs_ssh_keys(spec: ModelDeploymentSpec) -> bool:
    """Whether a group of this engine is launched over SSH (and so needs the keys Secret)."""
    return spec.engine.name == EngineName.TENSORRT_LLM


SSH_PORT: Final = 2222
"""The workers' SSH daemon: not 22, which a node's own daemon may hold where pods share the
host's network."""
SSH_KEYS_VOLUME: Final = "mpi-ssh-keys"
SSH_KEYS_DIR: Final = "/etc/inferfleet/mpi-ssh"
SSH_KEYS_CLIENT: Final = "client"
SSH_KEYS_CLIENT_PUBLIC: Final = "client.pub"
SSH_KEYS_HOST: Final = "host"
SSH_KEYS_HOST_PUBLIC: Final = "host.pub"
SSH_HOST_KEY_ALIAS: Final = "inferfleet-mpi-worker"
"""The name the leader looks the workers' host key up by, whatever a worker's address."""
SSH_CAPABILITIES: Final = ("SETGID", "SETUID", "SYS_CHROOT")
_SSH_RUN_DIR: Final = "/run/mpi-ssh"
"""Where the keys are copied with the modes ssh insists on: under /run, whose parents are
root's and not writable by others (sshd's StrictModes refuses a key file under /tmp)."""
_SSHD: Final = "/usr/sbin/sshd"
_KEPT_ENV: Final = "HOSTNAME|PWD|OLDPWD|SHLVL|_|LWS_*"
"""What the ranks on other nodes do not take from the leader's environment: its own pod's."""

_SSH_OPTIONS: Final = (
    f"-p {SSH_PORT} -i {_SSH_RUN_DIR}/id -o IdentitiesOnly=yes -o BatchMode=yes "
    f"-o HostKeyAlias={SSH_HOST_KEY_ALIAS} -o StrictHostKeyChecking=yes "
    f"-o UserKnownHostsFile={_SSH_RUN_DIR}/known_hosts -o ConnectTimeout=5"
)

# "$@" is the engine's command; each line of a script is a POSIX sh command. The leader is
# listed by its own host name (which Open MPI knows for itself: no SSH to it) and the workers by
# their full names (a pod's short name does not resolve: Open MPI keeps them whole only when
# told to, by version 4's and 5's names of the setting). mpirun by its absolute path starts
# each node's daemon from the same prefix (sshd's sessions have no PATH of the image's), and
# not through other workers (tree spawn: they hold no client key). A process started through
# the daemon has the daemon's environment, not the pod's: each rank gets the leader's, but
# for its own pod's variables.
_LEADER_SCRIPT: Final = """set -eu
mkdir -p -m 700 {run}
cp {keys}/{client} {run}/id
chmod 600 {run}/id
printf '{alias} %s\\n' "$(cat {keys}/{host_public})" > {run}/known_hosts
first=${{LWS_LEADER_ADDRESS%%.*}}
domain=${{LWS_LEADER_ADDRESS#*.}}
hosts="$(uname -n):{gpus}"
deadline=$(( $(date +%s) + {wait} ))
i=1
while [ "$i" -lt "$LWS_GROUP_SIZE" ]; do
  worker="$first-$i.$domain"
  until ssh {ssh} "$worker" true; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "worker $worker: no SSH answer on port {port} within {wait} s" >&2
      exit 1
    fi
    sleep 2
  done
  hosts="$hosts,$worker:{gpus}"
  i=$((i + 1))
done
set -- trtllm-llmapi-launch "$@"
for name in $(env | sed -n 's/^\\([A-Za-z_][A-Za-z0-9_]*\\)=.*/\\1/p' | sort -r); do
  case "$name" in
    {kept}) ;;
    *) if printenv "$name" > /dev/null; then set -- -x "$name" "$@"; fi ;;
  esac
done
export OMPI_MCA_orte_keep_fqdn_hostnames=1 PRTE_MCA_prte_keep_fqdn_hostnames=1
exec "$(command -v mpirun)" --allow-run-as-root -np $(({gpus} * LWS_GROUP_SIZE)) -H "$hosts" \\
  --mca plm_rsh_agent ssh --mca plm_rsh_no_tree_spawn 1 --mca plm_rsh_args "{ssh}" "$@"
"""

_WORKER_SCRIPT: Final = """set -eu
if [ ! -x {sshd} ]; then
  echo "this image has no SSH server ({sshd}), which the workers of a TensorRT-LLM replica over \\
several nodes run: name the image of runtime_images/tensorrt-llm in engine.image" >&2
  exit 1
fi
mkdir -p -m 700 {run}
cp {keys}/{host} {run}/host
cp {keys}/{client_public} {run}/authorized_keys
chmod 600 {run}/host {run}/authorized_keys
mkdir -p -m 755 /run/sshd
exec {sshd} -D -e -p {port} -h {run}/host \\
  -o AuthorizedKeysFile={run}/authorized_keys -o PermitRootLogin=prohibit-password \\
  -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no -o UsePAM=no \\
  -o PidFile=none
"""


def leader_wait_s(cold_start_seconds: int) -> int:
    """How long the leader waits for its workers' daemons (their pods start beside it, each
    pulling an engine image of 10-20 GB) before it exits and LWS recreates the group: a third
    of the cold start its startup probe allows, the rest left to load the model."""
    return max(60, cold_start_seconds // 3)


def leader_script(gpus: int, wait_s: int) -> str:
    """The leader's launch: the host list from LWS's environment, each worker's daemon waited
    for (at most `wait_s`), then `mpirun` over all of them with the engine's command (`"$@"`)
    and the leader's environment but for its own pod's variables."""
    return _LEADER_SCRIPT.format(
        run=_SSH_RUN_DIR, keys=SSH_KEYS_DIR, client=SSH_KEYS_CLIENT,
        host_public=SSH_KEYS_HOST_PUBLIC, alias=SSH_HOST_KEY_ALIAS, gpus=gpus,
        wait=wait_s, ssh=_SSH_OPTIONS, port=SSH_PORT, kept=_KEPT_ENV,
    )  # fmt: skip


def worker_script() -> str:
    """A worker's SSH daemon, in the foreground: it accepts the group's client key only and
    serves the group's host key."""
    return _WORKER_SCRIPT.format(
        run=_SSH_RUN_DIR, keys=SSH_KEYS_DIR, host=SSH_KEYS_HOST,
        client_public=SSH_KEYS_CLIENT_PUBLIC, port=SSH_PORT, sshd=_SSHD,
    )  # fmt: skip


def _keys_volume(secret: str, keys: tuple[str, str]) -> dict[str, Any]:
    """The Secret's keys a pod needs, no more: the leader's client key does not sit on the
    workers, nor their host key on the leader."""
    items = [{"key": key, "path": key} for key in keys]
    return {
        "name": SSH_KEYS_VOLUME,
        "secret": {"secretName": secret, "defaultMode": 0o400, "items": items},
    }


def _mpi_members(
    engine: EngineContainer, gpus: int, volumes: list[dict[str, Any]], secret: str
) -> tuple[EngineContainer, EngineContainer]:
    container = engine.container
    mount = {"name": SSH_KEYS_VOLUME, "mountPath": SSH_KEYS_DIR, "readOnly": True}
    mounts = sorted([*container.get("volumeMounts", []), mount], key=lambda m: str(m["mountPath"]))
    wait_s = leader_wait_s(engine.cold_start_seconds)
    leader: dict[str, Any] = {
        **container,
        "command": ["/bin/sh", "-c", leader_script(gpus, wait_s), "mpi-leader"],
        "args": [*container["command"], *container["args"]],
        "volumeMounts": mounts,
    }
    # The worker runs no engine of its own: mpirun starts its ranks through the daemon.
    worker = {
        k: copy.deepcopy(v)
        for k, v in container.items()
        if k not in ("ports", "command", "args", *_PROBES)
    }
    worker["command"] = ["/bin/sh", "-c", worker_script()]
    worker["volumeMounts"] = copy.deepcopy(mounts)
    leader_keys = _keys_volume(secret, (SSH_KEYS_CLIENT, SSH_KEYS_HOST_PUBLIC))
    worker_keys = _keys_volume(secret, (SSH_KEYS_HOST, SSH_KEYS_CLIENT_PUBLIC))
    return (
        replace(engine, container=leader, volumes=[*volumes, leader_keys], gpus=gpus),
        replace(
            engine,
            container=worker,
            volumes=copy.deepcopy([*volumes, worker_keys]),
            gpus=gpus,
            capabilities=SSH_CAPABILITIES,
        ),
    )
