"""What the fleet agent runs for a pod, and the pod status it reports, as a kubelet would:
pure functions of the pod (its container's command, args, environment, readiness probe and
grace period), so that any change of the pod (a new pod, a new IP) means a new process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from inferfleet.devcluster import oci
from inferfleet.devcluster.podspec import SecretValue, container_env, expand_references

SUBCOMMANDS: Final = ("sim-engine", "router", "weights")
DEFAULT_GRACE_S: Final = 30.0
# What a container needs from the host to start the venv's command, and nothing else.
HOST_ENV: Final = ("PATH", "HOME", "LANG", "TMPDIR")


class Kind(StrEnum):
    ENGINE = "sim-engine"
    ROUTER = "router"
    WEIGHTS = "weights"
    """A weight cache's fill or wait (`inferfleet weights`): no address, a volume."""


SERVERS: Final = (Kind.ENGINE, Kind.ROUTER)
"""What listens on the pod's address."""
ClaimDirectory = Callable[[str], Path | None]
"""The directory of this machine that serves a PersistentVolumeClaim of the pod's namespace
(None: not bound to one yet)."""


@dataclass(frozen=True)
class Probe:
    """An HTTP GET readiness probe, resolved to a port number, with its timeout and how many
    failures in a row take a ready container out (Kubernetes' defaults where unset)."""

    path: str
    port: int
    timeout_s: float = 1.0
    failure_threshold: int = 3


@dataclass(frozen=True)
class PodProcess:
    """What runs for one pod: derived from the pod alone, so that any change of it (a new
    pod, a new IP) means a new process."""

    uid: str
    namespace: str
    name: str
    container: str
    kind: Kind | None
    """The venv's subcommand it runs; None for an image's other commands (the operator)."""
    ip: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    grace_s: float = DEFAULT_GRACE_S
    pre_stop_s: float = 0.0
    """The container's preStop sleep: a deleted pod's process runs on this long (within its
    grace) before SIGTERM, as a kubelet runs the hook."""
    service_account: str | None = None
    """The ServiceAccount whose token a router gets."""
    readiness: Probe | None = None
    image: oci.Image | None = None
    """In the OCI runtime mode: the image it runs from, and how (argv and env are then the
    container's own)."""
    launch: oci.Launch | None = None
    restart_policy: str = "Always"
    """The pod's `restartPolicy`: Always, OnFailure or Never (a `helm test` pod's)."""
    init: tuple[tuple[str, ...], ...] = ()
    """The argv of each init container, run to success in order before `argv`, once per
    pod (the venv mode; only `inferfleet weights` ones)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}_{self.name}"

    @property
    def files(self) -> str:
        """Its directory under `pods/`: by uid too, as a pod may come back under its name."""
        return f"{self.key}_{self.uid}"


def listen_on(args: Sequence[str], ip: str) -> list[str]:
    """`args` with any `--host` dropped and `--host <ip>` added: the pod's address replaces
    the wildcard, as the pod's own network namespace would make it the only one."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--host":
            skip = True
        elif not arg.startswith("--host="):
            kept.append(arg)
    return [*kept, "--host", ip]


def readiness_probe(container: Mapping[str, Any]) -> Probe | None:
    """The container's HTTP GET readiness probe, a named port resolved to its number."""
    http = (container.get("readinessProbe") or {}).get("httpGet")
    if not http:
        return None
    port = http.get("port")
    if isinstance(port, str) and not port.isdigit():
        named = [p for p in container.get("ports") or [] if p.get("name") == port]
        if not named:
            return None
        port = named[0]["containerPort"]
    probe = container["readinessProbe"]
    return Probe(
        str(http.get("path") or "/"),
        int(port),
        timeout_s=float(probe.get("timeoutSeconds") or 1),
        failure_threshold=int(probe.get("failureThreshold") or 3),
    )


def pod_is_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
    return not deleting and status.get("phase") == "Running" and bool(status.get("podIP"))


def _first_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container to run, if the pod is Running with an address and has one."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return containers[0] if pod_is_running(pod) and containers else None


def _pod_fields(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, Any]:
    """What a pod's process takes from the pod and its container, whatever runs it."""
    metadata, spec = pod["metadata"], pod.get("spec") or {}
    grace = spec.get("terminationGracePeriodSeconds")
    return {
        "uid": str(metadata.get("uid", "")),
        "namespace": str(metadata.get("namespace", "")),
        "name": str(metadata["name"]),
        "container": str(container.get("name", "")),
        "ip": str(pod["status"]["podIP"]),
        "grace_s": float(DEFAULT_GRACE_S if grace is None else grace),
        "pre_stop_s": pre_stop_sleep_s(container),
        "readiness": readiness_probe(container),
        "restart_policy": str(spec.get("restartPolicy") or "Always"),
    }


def pre_stop_sleep_s(container: Mapping[str, Any]) -> float:
    """The seconds of the container's preStop `sleep` action (0: none; other actions, which
    the fleet agent does not run, count as none)."""
    sleep = ((container.get("lifecycle") or {}).get("preStop") or {}).get("sleep") or {}
    seconds = sleep.get("seconds")
    return float(seconds) if isinstance(seconds, int) and seconds > 0 else 0.0


def pod_process(
    pod: Mapping[str, Any], executable: str, claim_directory: ClaimDirectory | None = None
) -> PodProcess | None:
    """The process to run for a pod: None unless it is Running with an address and its
    first container runs `inferfleet sim-engine`, `router` or `weights`. `executable`
    replaces the image's `inferfleet`. Its PersistentVolumeClaim volumes are directories of
    this machine (`claim_directory`): an argument under a mount path names the same file
    there, as the mount would show it. Raises ValueError for a pod that cannot run so."""
    container = _first_container(pod)
    if container is None:
        return None
    kind = _subcommand(container)
    if kind is None:
        return None
    fields = _pod_fields(pod, container)
    env = container_env(pod, container)
    args = _host_args(pod, container, env, claim_directory)
    if kind in SERVERS:
        args = listen_on(args, fields["ip"])
    init = []
    for init_container in (pod.get("spec") or {}).get("initContainers") or []:
        init_kind = _subcommand(init_container)
        if init_kind is not None:
            own_env = container_env(pod, init_container)
            own = _host_args(pod, init_container, own_env, claim_directory)
            init.append((executable, init_kind.value, *own))
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    return PodProcess(
        **fields,
        kind=kind,
        argv=(executable, kind.value, *args),
        env=env,
        service_account=str(account) if kind in (Kind.ROUTER, Kind.WEIGHTS) else None,
        init=tuple(init),
    )


def _subcommand(container: Mapping[str, Any]) -> Kind | None:
    command = list(container.get("command") or [])
    if len(command) != 2 or Path(command[0]).name != "inferfleet" or command[1] not in SUBCOMMANDS:
        return None
    return Kind(command[1])


def _host_args(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    env: Mapping[str, str],
    claim_directory: ClaimDirectory | None,
) -> list[str]:
    args = [expand_references(str(arg), env) for arg in container.get("args") or []]
    mounts = claim_mounts(pod, container, claim_directory)
    return [host_path(arg, mounts) for arg in args]


def claim_mounts(
    pod: Mapping[str, Any], container: Mapping[str, Any], claim_directory: ClaimDirectory | None
) -> dict[str, Path]:
    """The container's mount paths of PersistentVolumeClaims, and the directories that serve
    them."""
    claims = {
        str(v["name"]): str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if v.get("persistentVolumeClaim")
    }
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        claim = claims.get(str(mount.get("name")))
        if claim is None:
            continue
        directory = claim_directory(claim) if claim_directory is not None else None
        if directory is None:
            raise ValueError(f"persistentVolumeClaim {claim} is not bound to a volume (yet)")
        mounts[str(mount["mountPath"]).rstrip("/")] = directory / str(mount.get("subPath") or "")
    return mounts


def host_path(arg: str, mounts: Mapping[str, Path]) -> str:
    """`arg` (or the value of `--flag=arg`) with a mount path's prefix replaced by the
    directory that serves it."""
    flag, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    for mount, directory in mounts.items():
        if value == mount or value.startswith(f"{mount}/"):
            value = str(directory) + value[len(mount) :]
            break
    return f"{flag}{equals}{value}"


def oci_pod_process(
    pod: Mapping[str, Any],
    find_image: Callable[[str], oci.Image | None],
    api_server: tuple[str, int],
    secret: SecretValue | None = None,
) -> PodProcess | None:
    """The container to run from its image for a pod: None unless it is Running with an
    address and its first container's image is in the store (`find_image`). A router's or
    sim engine's `inferfleet` listens on the pod's IP, as in the venv mode; any other command
    (the operator's `inferfleet run`) runs as the pod says. Raises `oci.ImageError` (a
    `ValueError`) for a pod that cannot run as it is."""
    container = _first_container(pod)
    if container is None:
        return None
    image = find_image(str(container.get("image") or ""))
    if image is None:
        return None
    ip = str(pod["status"]["podIP"])
    launch = oci.container_launch(pod, container, image.config, api_server, secret)
    argv = launch.argv
    kind = None
    if len(argv) >= 2 and Path(argv[0]).name == "inferfleet" and argv[1] in SUBCOMMANDS:
        kind = Kind(argv[1])
        argv = (*argv[:2], *listen_on(argv[2:], ip))
        launch = dataclasses.replace(launch, argv=argv)
    return PodProcess(
        **_pod_fields(pod, container),
        kind=kind,
        argv=argv,
        env=dict(launch.env),
        service_account=str((pod.get("spec") or {}).get("serviceAccountName") or "default"),
        image=image,
        launch=launch,
    )


def readiness_status(
    container: str, ready: bool, reason: str, restarts: int, now: datetime
) -> dict[str, Any]:
    """The pod status a kubelet writes when a container's readiness changes or it restarts
    (a strategic merge: conditions by type, container statuses by name)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    value = "True" if ready else "False"
    conditions = [
        {"type": kind, "status": value, "lastTransitionTime": stamp}
        | ({} if ready else {"reason": reason})
        for kind in ("Ready", "ContainersReady")
    ]
    return {
        "conditions": conditions,
        "containerStatuses": [{"name": container, "ready": ready, "restartCount": restarts}],
    }


def restarts_after(restart_policy: str, exit_code: int) -> bool:
    """Whether a kubelet starts a container again after it exited with `exit_code`."""
    if restart_policy == "Never":
        return False
    return restart_policy != "OnFailure" or exit_code != 0


def terminated_status(
    container: str, exit_code: int, restarts: int, now: datetime
) -> dict[str, Any]:
    """The pod status a kubelet writes when its container exits for good (restartPolicy
    Never, or OnFailure after a success): the pod's phase is the exit's verdict."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    succeeded = exit_code == 0
    return {
        "phase": "Succeeded" if succeeded else "Failed",
        "conditions": [
            {"type": kind, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
            for kind in ("Ready", "ContainersReady")
        ],
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "restartCount": restarts,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Completed" if succeeded else "Error",
                        "finishedAt": stamp,
                    }
                },
            }
        ],
    }


def service_account_kubeconfig(server: str, ca_file: Path, token_file: Path) -> dict[str, Any]:
    """A kubeconfig for the API server with a ServiceAccount token read from a file."""
    name = "inferfleet-dev"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": name, "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


def host_environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {name: environ[name] for name in HOST_ENV if name in environ}
