"""The fleet agent: the part of a kubelet the dev cluster's fake nodes lack, for inferfleet's
own processes.

kwok turns pods Running with an address in 127.1.0.0/16 and runs nothing. The fleet agent
watches pods through the API and, for each Running pod whose container command is
`inferfleet sim-engine` or `inferfleet router`, runs that command with its args as a real
process of this machine, bound to the pod's IP (a real pod has a network namespace of its own;
here the pod IP replaces the wildcard listen address: `--host <podIP>`), with the container's
environment resolved as a kubelet resolves it (`value`, `fieldRef`, `$(VAR)` in args). A
process that dies while its pod exists is restarted with exponential backoff, as a kubelet
does (from 1 s, doubling to 60 s: quicker than a kubelet's 10 s to 5 min, for a playground),
unless the pod's `restartPolicy` says otherwise (Never, or OnFailure after a success): then its
pod turns Succeeded or Failed by the exit status, as a `helm test` pod must.
A pod deleted or no longer Running: its container's preStop sleep (the process serves on),
then SIGTERM to its process group, SIGKILL once the pod's termination grace period is over.
kwok hands a deleted pod's IP to the next pod at once; a pod given the IP of one whose process
still stops is started when that process has ended (not Ready until then, reason
`PodIPHeld`), as a kubelet keeps an IP until the pod's sandbox is gone.

Identity: a router pod's process gets its pod's ServiceAccount as a kubelet gives it: a token
from the TokenRequest API, bound to the pod, in a kubeconfig for the dev cluster's API server
passed as `KUBECONFIG`; so the router runs with exactly its rendered RBAC. The token lives
for a day and is requested again at each (re)start of the process; clients read it once, so
it is not rotated in place as a kubelet's projected token is.

Readiness: with the fleet, kwok turns a pod with a readiness probe Running but not Ready, as a
kubelet starts it (`components.fleet_pod_stages`), and the agent reports what the container's
readiness probe (an HTTP GET) actually sees, as a kubelet would: the pod's `Ready` and
`ContainersReady` conditions turn True once the process answers, and follow it after, out
only after the probe's `failureThreshold` failures in a row, each given its `timeoutSeconds`;
the container status carries the restart count. A pod the agent runs nothing for is made Ready
at once, as kwok alone makes every pod. kwok's stages leave a Running pod's status alone, so
nothing overwrites that. Probes run every second (the rendered periods are meant for GPUs and
slow model loads).

Each process sees only its container's environment (plus PATH and HOME), not the agent's
credentials. Logs go to `<state dir>/logs/pods/<namespace>_<pod>.log`, per-pod files
(kubeconfig, token) to `<state dir>/pods/<namespace>_<pod>_<uid>/`, removed with the pod.
Nothing outlives the agent: processes run in process groups of their own, bound to the agent by
PDEATHSIG, and stopped on SIGTERM.

The OCI runtime mode (`--images STORE`): instead of the venv's `inferfleet`, each Running pod
whose first container's image is in the store runs from that image through crun (`oci`): the
kubelet's command/args rules over the image's entrypoint and cmd, the image's env under the
container's, the pod's user, volumes (emptyDir; the projected ServiceAccount token, CA
and namespace that in-cluster clients read; Secrets, written at each start and again while
the pod runs, as a kubelet updates them; with KUBERNETES_SERVICE_HOST/PORT naming this API
server), in namespaces of its own but the host's network (routers and sim engines still get
`--host <podIP>`). Any command runs so, the operator's `inferfleet run` too; a pod whose
image is not in the store is left alone (said once). Restarts, probes, readiness, grace and
logs are as above; crun forwards SIGTERM to the container, and `crun delete --force` ends
one whose crun was killed.

Everything that decides what to run is pure (`devcluster.pod_process` and `oci`).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import httpx
import yaml
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
)

from inferfleet.devcluster import kubelet_api, oci, processes, volumes
from inferfleet.devcluster.pod_process import (
    PodProcess,
    host_environment,
    oci_pod_process,
    pod_is_running,
    pod_process,
    readiness_status,
    restarts_after,
    service_account_kubeconfig,
    terminated_status,
)
from inferfleet.devcluster.processes import ProcessSpec
from inferfleet.kube import Kube
from inferfleet.kube.reflector import until_stopped

log = logging.getLogger(__name__)

TOKEN_LIFETIME_S: Final = 24 * 3600
PROBE_INTERVAL_S: Final = 1.0
SECRET_SYNC_S: Final = 5.0
"""How often a running OCI pod's Secret volumes are written again from the API server (a
kubelet's sync takes up to about a minute; shorter here, so that tests wait less)."""
SECRET_READ_TIMEOUT_S: Final = 5.0
"""The longest a Secret's read may take: an API server that does not answer (stopped, or
overloaded) delays the pod's sync and its probes by at most this long."""
# On the agent's own shutdown, pods get at most this long: `dev-cluster down` waits 10 s.
SHUTDOWN_GRACE_S: Final = 7.0


def read_secret(kube: Kube, namespace: str, name: str) -> dict[str, bytes] | None:
    """A Secret's keys and their decoded values (None: no such Secret), read within
    `SECRET_READ_TIMEOUT_S`, for a container's environment and its volumes alike."""
    found = kube.get("v1", "Secret", name, namespace, timeout_s=SECRET_READ_TIMEOUT_S)
    if found is None:
        return None
    return {key: base64.b64decode(value) for key, value in (found.get("data") or {}).items()}


@dataclass(frozen=True)
class AgentContext:
    """What every pod's supervision shares: the API, where files go, what routers reach."""

    kube: Kube
    state_dir: Path
    api_server: str
    ca_file: Path
    executable: str
    images: oci.ImageStore | None = None
    """The OCI runtime mode: pods run from these images through crun (else the venv's
    `inferfleet` runs as a host process)."""
    hide_unified_cgroup: bool = False

    @property
    def crun_root(self) -> Path:
        return self.state_dir / "crun"

    @property
    def api_address(self) -> tuple[str, int]:
        """The API server's host and port, for KUBERNETES_SERVICE_HOST/PORT."""
        url = httpx.URL(self.api_server)
        return str(url.host), int(url.port or 443)


class ProcessExitedError(RuntimeError):
    """The pod's process ended while its pod still runs."""


class PodSupervisor:
    """Runs one pod's process on a thread of its own, restarting it with backoff until told
    to stop. The thread that starts the process outlives it, so PDEATHSIG (which follows the
    starting thread) fires only if the whole agent dies."""

    def __init__(
        self,
        pod: PodProcess,
        context: AgentContext,
        report_ready: Callable[[PodProcess, bool, str, int], None],
        report_terminated: Callable[[PodProcess, int, int], None],
        predecessors: Sequence[threading.Thread] = (),
    ) -> None:
        self.pod = pod
        self._predecessors = list(predecessors)
        """Supervisors' threads of deleted pods that had this pod's IP, still stopping."""
        self.context = context
        self.report_ready = report_ready
        self.report_terminated = report_terminated
        self.restarts = 0
        self._init_done = 0
        """Init containers run to success so far."""
        self.grace_s = pod.grace_s
        self._stopping = threading.Event()
        self._secret_problems: dict[str, str] = {}
        """Per Secret, why its last sync failed ("" when it did not): each said once."""
        self.thread = threading.Thread(target=self._run, name=f"pod-{pod.key}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, grace_s: float | None = None) -> None:
        """Ask the process to end (within `grace_s`, else the pod's grace); returns at once."""
        if grace_s is not None:
            self.grace_s = min(self.grace_s, grace_s)
        self._stopping.set()

    def _await_address(self) -> bool:
        """Wait until the processes of deleted pods that had this pod's IP have ended; whether
        to start (False: this pod was stopped meanwhile). kwok frees a pod's IP with the pod
        object and hands it to the next pod at once, while the process of the pod deleted may
        still drain within its grace, bound to that IP; a kubelet keeps an IP until the pod's
        sandbox is gone. Started before, the new process could not bind (a crash loop that
        counts restarts), and calls to the IP would reach the old pod's process."""
        held = [thread for thread in self._predecessors if thread.is_alive()]
        if not held:
            return True
        log.info("%s: its IP %s is held by a stopping pod's process", self.pod.key, self.pod.ip)
        self.report_ready(self.pod, False, "PodIPHeld", self.restarts)
        for thread in held:
            while thread.is_alive():
                if self._stopping.wait(PROBE_INTERVAL_S):
                    return False
        log.info("%s: its IP %s is free", self.pod.key, self.pod.ip)
        return True

    def _run(self) -> None:
        if not self._await_address():
            self._cleanup()
            return
        retrying = Retrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(multiplier=1, min=1, max=60),
            stop=stop_when_event_set(self._stopping),
            # Sleeps end early when the pod goes away.
            sleep=self._sleep,
            before_sleep=lambda state: log.warning(
                "%s: %s; restarting", self.pod.key, state.outcome and state.outcome.exception()
            ),
        )
        try:
            retrying(self._run_once)
        except RetryError:
            pass  # stopped while backing off
        finally:
            self._cleanup()

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _environment(self) -> dict[str, str]:
        env = host_environment(os.environ) | dict(self.pod.env)
        if self.pod.service_account is not None:
            directory = self.context.state_dir / "pods" / self.pod.files
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            token = kubelet_api.request_token(
                self.context.kube,
                self.pod.service_account,
                self.pod.namespace,
                expiration_s=TOKEN_LIFETIME_S,
                bound_pod=(self.pod.name, self.pod.uid),
            )
            token_file = directory / "token"
            token_file.touch(mode=0o600)
            token_file.write_text(token)
            kubeconfig = directory / "kubeconfig"
            kubeconfig.write_text(
                yaml.safe_dump(
                    service_account_kubeconfig(
                        self.context.api_server, self.context.ca_file, token_file
                    )
                )
            )
            env["KUBECONFIG"] = str(kubeconfig)
        return env

    @property
    def _directory(self) -> Path:
        return self.context.state_dir / "pods" / self.pod.files

    @property
    def _container_id(self) -> str:
        return oci.container_id(self.pod.namespace, self.pod.name, self.pod.uid)

    def _container_spec(self) -> ProcessSpec:
        """The OCI mode: a fresh bundle (the image's root filesystem under a new writable
        layer, as a restarted container gets), the pod's volumes, then crun."""
        image, launch = self.pod.image, self.pod.launch
        assert image is not None
        assert launch is not None
        assert self.context.images is not None
        image_rootfs = self.context.images.rootfs(image)
        volumes = self._directory / "volumes"
        for volume in launch.volumes:
            self._prepare_volume(volumes / volume.name, volume)
        bundle = oci.Bundle(self._directory / "bundle")
        shutil.rmtree(bundle.directory, ignore_errors=True)
        for directory in (bundle.rootfs, bundle.upper, bundle.work):
            directory.mkdir(parents=True)
        config = oci.runtime_config(launch, bundle.rootfs, volumes)
        (bundle.directory / "config.json").write_text(json.dumps(config, indent=1))
        self._delete_container()  # one left by an agent that died
        argv = oci.crun_argv(
            "crun",
            self.context.crun_root,
            self._container_id,
            bundle,
            image_rootfs,
            hide_unified_cgroup=self.context.hide_unified_cgroup,
        )
        return ProcessSpec(self.pod.key, argv, host_environment(os.environ))

    def _prepare_volume(self, directory: Path, volume: oci.Volume) -> None:
        """An emptyDir's directory (kept across restarts, as a kubelet keeps it), or a
        projected volume's files written afresh: a token bound to the pod, ConfigMap keys,
        downward API fields."""
        directory.mkdir(parents=True, exist_ok=True)
        if not volume.files:
            directory.chmod(oci.EMPTY_DIR_MODE)
            return
        directory.chmod(0o755)
        for item in volume.files:
            if isinstance(item, oci.SecretKeys):
                self._write_secret(directory, item)
                continue
            if isinstance(item, oci.Token):
                content = kubelet_api.request_token(
                    self.context.kube,
                    self.pod.service_account or "default",
                    self.pod.namespace,
                    expiration_s=item.expiration_s,
                    bound_pod=(self.pod.name, self.pod.uid),
                )
            elif isinstance(item, oci.ConfigMapKey):
                found = self.context.kube.get(
                    "v1", "ConfigMap", item.config_map, self.pod.namespace
                )
                data = (found or {}).get("data") or {}
                if item.key not in data:
                    raise LookupError(f"configMap {item.config_map} has no key {item.key} (yet)")
                content = str(data[item.key])
            else:
                content = item.value
            target = directory / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
            target.chmod(oci.PROJECTED_FILE_MODE)

    def _write_secret(self, directory: Path, item: oci.SecretKeys) -> None:
        """Each key of the Secret as a file, each replaced whole (a reader never sees one
        half written)."""
        data = read_secret(self.context.kube, self.pod.namespace, item.secret)
        if data is None:
            raise LookupError(f"secret {item.secret} not found (yet)")
        for key, content in data.items():
            target = directory / key
            if target.is_file() and target.read_bytes() == content:
                continue
            written = directory / f".{key}.new"
            written.unlink(missing_ok=True)
            # Readable by the owner alone until it has the Secret's mode and group.
            descriptor = os.open(written, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            with os.fdopen(descriptor, "wb") as file:
                if item.group is not None:
                    os.fchown(file.fileno(), -1, item.group)
                os.fchmod(file.fileno(), item.mode)
                file.write(content)
            os.replace(written, target)

    def _sync_secrets(self) -> None:
        """Write a running OCI pod's Secret volumes again, as a kubelet does when the Secrets
        change; one that cannot be read now keeps its files (logged)."""
        launch = self.pod.launch
        if launch is None:
            return
        for volume in launch.volumes:
            for item in volume.files:
                if not isinstance(item, oci.SecretKeys):
                    continue
                try:
                    self._write_secret(self._directory / "volumes" / volume.name, item)
                except Exception as error:  # gone or unreachable for now: the next sync tries
                    problem = str(error)
                else:
                    problem = ""
                if problem != self._secret_problems.get(item.secret, ""):
                    self._secret_problems[item.secret] = problem
                    if problem:
                        log.warning(
                            "%s: secret %s not updated: %s", self.pod.key, item.secret, problem
                        )

    def _delete_container(self) -> None:
        subprocess.run(
            ["crun", "--root", str(self.context.crun_root), "--cgroup-manager=disabled",
             "delete", "--force", self._container_id],
            capture_output=True, check=False,
        )  # fmt: skip

    def _run_once(self) -> None:
        if self._stopping.is_set():
            return
        logs = self.context.state_dir / "logs" / "pods"
        logs.mkdir(parents=True, exist_ok=True)
        if not self._initialized(logs):
            return
        if self.pod.image is not None:
            spec = self._container_spec()
        else:
            spec = ProcessSpec(self.pod.key, self.pod.argv, self._environment())
        try:
            self._supervise(processes.popen(spec, logs, bound_to_parent=True, inherit_env=False))
        finally:
            if self.pod.image is not None:
                # crun forwards SIGTERM; after a SIGKILL of crun, this ends the container.
                self._delete_container()

    def _initialized(self, logs: Path) -> bool:
        """Run the init containers not yet run to success, in order, as a kubelet runs them
        once per pod; False when the pod was stopped meanwhile. One that fails raises, and is
        run again after the backoff."""
        for index in range(self._init_done, len(self.pod.init)):
            spec = ProcessSpec(
                f"{self.pod.key}_init-{index}", self.pod.init[index],
                host_environment(os.environ),
            )  # fmt: skip
            process = processes.popen(spec, logs, bound_to_parent=True, inherit_env=False)
            log.info("%s: init container %d started (pid %d)", self.pod.key, index, process.pid)
            while process.poll() is None:
                if self._stopping.wait(PROBE_INTERVAL_S):
                    processes.stop([process.pid], grace_s=self.grace_s)
                    return False
            if process.returncode != 0:
                raise ProcessExitedError(f"init container {index} exited with {process.returncode}")
            self._init_done = index + 1
        return True

    def _supervise(self, process: subprocess.Popen[bytes]) -> None:
        what = " ".join([Path(self.pod.argv[0]).name, *self.pod.argv[1:2]])
        if self.pod.image is not None:
            what += f" from {self.pod.image.reference} in crun"
        log.info("%s: started %s (pid %d)", self.pod.key, what, process.pid)
        ready: bool | None = None
        failures = 0
        secrets_synced = time.monotonic()
        try:
            while process.poll() is None:
                passed = self._probe()
                failures = 0 if passed else failures + 1
                # As a kubelet: a ready container stays ready until `failureThreshold` probes
                # in a row fail (a busy engine answering one probe late is not taken out).
                threshold = self.pod.readiness.failure_threshold if self.pod.readiness else 1
                observed = passed or (ready is True and failures < threshold)
                if observed != ready:
                    ready = observed
                    reason = "ProbeSucceeded" if observed else "ProbeFailed"
                    self.report_ready(self.pod, observed, reason, self.restarts)
                if time.monotonic() - secrets_synced >= SECRET_SYNC_S:
                    self._sync_secrets()
                    secrets_synced = time.monotonic()
                if self._stopping.wait(PROBE_INTERVAL_S):
                    # The preStop sleep, within the grace: the process serves on meanwhile.
                    hook_s = min(self.pod.pre_stop_s, self.grace_s)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(timeout=hook_s)
                    processes.stop([process.pid], grace_s=max(0.0, self.grace_s - hook_s))
                    log.info("%s: stopped (pid %d)", self.pod.key, process.pid)
                    return
        finally:
            if process.poll() is None:
                processes.stop([process.pid], grace_s=self.grace_s)
        if self._stopping.is_set():
            return
        if not restarts_after(self.pod.restart_policy, process.returncode):
            log.info("%s: exited with status %d, for good", self.pod.key, process.returncode)
            self.report_terminated(self.pod, process.returncode, self.restarts)
            return
        self.restarts += 1
        self.report_ready(self.pod, False, "ContainerExited", self.restarts)
        raise ProcessExitedError(f"exited with status {process.returncode}")

    def _probe(self) -> bool:
        probe = self.pod.readiness
        if probe is None:
            return True
        try:
            answer = httpx.get(
                f"http://{self.pod.ip}:{probe.port}{probe.path}", timeout=probe.timeout_s
            )
        except httpx.HTTPError:
            return False
        return bool(200 <= answer.status_code < 400)

    def _cleanup(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


class FleetAgent:
    """Watches every pod and keeps one supervised process per pod that should have one."""

    def __init__(self, context: AgentContext) -> None:
        self.context = context
        self.stopped = threading.Event()
        self.supervisors: dict[str, PodSupervisor] = {}
        # Supervisors of pods gone or changed whose processes may still be stopping.
        self._stopping: list[PodSupervisor] = []
        self._pods: dict[str, Mapping[str, Any]] = {}
        self._lock = threading.Lock()
        # Pods left alone, each said once: (uid, why).
        self._reported: set[tuple[str, str]] = set()
        # Pods the agent runs nothing for, made Ready once (by uid).
        self._readied: set[str] = set()
        # Secret values of containers' environments, by (pod uid, Secret, key): read once.
        self._env_secrets: dict[tuple[str, str, str], str] = {}
        # The directories of bound claims, by (namespace, claim).
        self._claims: dict[tuple[str, str], Path] = {}

    def _process(self, pod: Mapping[str, Any]) -> PodProcess | None:
        images = self.context.images
        metadata = pod.get("metadata") or {}
        namespace, uid = str(metadata.get("namespace", "")), str(metadata.get("uid", ""))
        if images is None:
            claims = functools.partial(self._claim_directory, namespace)
            return pod_process(pod, self.context.executable, claims)
        process = oci_pod_process(
            pod, images.find, self.context.api_address,
            functools.partial(self._secret, namespace, uid),
        )  # fmt: skip
        if process is None and pod_is_running(pod):
            containers = (pod.get("spec") or {}).get("containers") or [{}]
            self._report_once(pod, f"image {containers[0].get('image')!r} is not in {images}")
        return process

    def _claim_directory(self, namespace: str, claim: str) -> Path | None:
        """The directory of the volume bound to a claim (a binding never changes: kept)."""
        known = self._claims.get((namespace, claim))
        if known is not None:
            return known
        found = self.context.kube.get("v1", "PersistentVolumeClaim", claim, namespace) or {}
        volume_name = (found.get("spec") or {}).get("volumeName")
        volume = self.context.kube.get("v1", "PersistentVolume", str(volume_name)) or {}
        path = ((volume.get("spec") or {}).get("hostPath") or {}).get("path")
        if not volume_name or not path:
            return None
        self._claims[(namespace, claim)] = Path(path)
        return Path(path)

    def _secret(self, namespace: str, uid: str, name: str, key: str) -> str:
        """A Secret's value for a container's environment, read once for the pod, as a kubelet
        reads it when it starts the container: a Secret changed later reaches a running
        container through its volumes only, and the pod's process is not started again."""
        remembered = self._env_secrets.get((uid, name, key))
        if remembered is not None:
            return remembered
        value = (read_secret(self.context.kube, namespace, name) or {}).get(key)
        if value is None:
            raise oci.ImageError(f"secret {name} has no key {key} (yet)")
        decoded = value.decode()
        self._env_secrets[(uid, name, key)] = decoded
        return decoded

    def _report_once(self, pod: Mapping[str, Any], why: str) -> None:
        metadata = pod.get("metadata") or {}
        if (str(metadata.get("uid")), why) not in self._reported:
            self._reported.add((str(metadata.get("uid")), why))
            log.warning(
                "%s/%s: left alone: %s", metadata.get("namespace"), metadata.get("name"), why
            )

    def desired(self) -> dict[str, PodProcess]:
        wanted = {}
        for uid, pod in self._pods.items():
            try:
                process = self._process(pod)
            except ValueError as error:
                self._report_once(pod, f"cannot run: {error}")
                process = None
            if process is not None:
                wanted[uid] = process
            else:
                self._ready_unrun(pod)
        return wanted

    def _ready_unrun(self, pod: Mapping[str, Any]) -> None:
        """A Running pod the agent runs nothing for turns Ready, as kwok alone would make it:
        kwok's stages leave a pod with a readiness probe unready for the agent
        (`components.fleet_pod_stages`), whose probe here has nothing to ask."""
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = str(metadata.get("uid", ""))
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        if ready or uid in self._readied or not pod_is_running(pod):
            return
        self._readied.add(uid)
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        try:
            kubelet_api.patch_pod_status(
                self.context.kube,
                str(metadata.get("name")),
                str(metadata.get("namespace")),
                readiness_status(
                    str(containers[0].get("name")), True, "NotRunByTheFleet", 0, datetime.now(UTC)
                ),
            )
        except Exception as error:  # a pod deleted meanwhile: nothing to report
            log.info("%s/%s: readiness not reported: %s", metadata.get("namespace"),
                     metadata.get("name"), error)  # fmt: skip

    def reconcile(self) -> None:
        """Stop processes whose pod went away or changed; start those missing."""
        with self._lock:
            if self.stopped.is_set():
                return
            wanted = self.desired()
            for remembered in [k for k in self._env_secrets if k[0] not in self._pods]:
                del self._env_secrets[remembered]
            self._readied &= self._pods.keys()
            for uid, supervisor in list(self.supervisors.items()):
                if wanted.get(uid) != supervisor.pod:
                    supervisor.stop()
                    del self.supervisors[uid]
                    self._stopping.append(supervisor)
            self._stopping = [s for s in self._stopping if s.thread.is_alive()]
            for uid, process in wanted.items():
                if uid not in self.supervisors:
                    supervisor = PodSupervisor(
                        process, self.context, self._report_ready, self._report_terminated,
                        [s.thread for s in self._stopping if s.pod.ip == process.ip],
                    )  # fmt: skip
                    self.supervisors[uid] = supervisor
                    supervisor.start()

    def _report_ready(self, pod: PodProcess, ready: bool, reason: str, restarts: int) -> None:
        try:
            kubelet_api.patch_pod_status(
                self.context.kube,
                pod.name,
                pod.namespace,
                readiness_status(pod.container, ready, reason, restarts, datetime.now(UTC)),
            )
        except Exception as error:  # a pod deleted meanwhile: nothing to report
            log.info("%s: readiness not reported: %s", pod.key, error)

    def _report_terminated(self, pod: PodProcess, exit_code: int, restarts: int) -> None:
        try:
            kubelet_api.patch_pod_status(
                self.context.kube,
                pod.name,
                pod.namespace,
                terminated_status(pod.container, exit_code, restarts, datetime.now(UTC)),
            )
        except Exception as error:  # a pod deleted meanwhile: nothing to report
            log.info("%s: termination not reported: %s", pod.key, error)

    def _sync_once(self) -> None:
        listed: dict[str, Mapping[str, Any]] = {}
        for kind, item in self.context.kube.list_and_watch("v1", "Pod", None, "", for_s=60):
            if self.stopped.is_set():
                return
            uid = str((item.get("metadata") or {}).get("uid", ""))
            if kind == "LISTED":
                listed[uid] = item
                continue
            if kind == "SYNCED":
                self._pods = listed
            elif kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = item
            self.reconcile()

    def run(self) -> None:
        """List and watch pods until stopped; the API server unreachable: back off, retry."""
        until_stopped(self._sync_once, self.stopped, "pod watch")

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop every process (each within its grace, at most `grace_s`) and wait for them."""
        with self._lock:
            self.stopped.set()
            supervisors = [*self.supervisors.values(), *self._stopping]
            self.supervisors.clear()
        for supervisor in supervisors:
            supervisor.stop(grace_s)
        deadline = time.monotonic() + grace_s + 2.0
        for supervisor in supervisors:
            supervisor.thread.join(max(0.0, deadline - time.monotonic()))


def _venv_inferfleet() -> str:
    found = shutil.which("inferfleet", path=str(Path(sys.executable).parent))
    return found or "inferfleet"


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m inferfleet.devcluster.fleet STATE_DIR`: what `dev-cluster up --with-fleet`
    starts, with the cluster's admin credentials (it stands in for every kubelet)."""
    parser = argparse.ArgumentParser(prog="inferfleet-fleet-agent", description=__doc__)
    parser.add_argument("state_dir", type=Path, help="The dev cluster's state directory.")
    parser.add_argument(
        "--images",
        type=Path,
        help="Run pods from their images in this store (OCI layouts) through crun, instead "
        "of the venv's inferfleet as host processes.",
    )
    options = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per readiness probe would drown what the agent does.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    state_dir: Path = options.state_dir.resolve()
    kubeconfig_path = state_dir / "kubeconfigs" / "admin.yaml"
    cluster = yaml.safe_load(kubeconfig_path.read_text())["clusters"][0]["cluster"]
    agent = FleetAgent(
        AgentContext(
            Kube.from_kubeconfig(kubeconfig_path),
            state_dir,
            api_server=str(cluster["server"]),
            ca_file=Path(cluster["certificate-authority"]),
            executable=_venv_inferfleet(),
            images=oci.ImageStore(options.images) if options.images else None,
            hide_unified_cgroup=oci.unified_cgroup_has_controllers(),
        )
    )

    if agent.context.images is not None:
        left = oci.delete_all("crun", agent.context.crun_root)
        if left:
            log.info("removed containers left by an earlier agent: %s", ", ".join(left))

    def terminate(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping every pod's process", signum)
        agent.shutdown()
        sys.exit(0)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    watcher = threading.Thread(target=agent.run, name="pod-watch", daemon=True)
    watcher.start()
    provisioner = volumes.Provisioner(agent.context.kube, state_dir / "volumes", agent.stopped)
    threading.Thread(target=provisioner.run, name="volume-provisioner", daemon=True).start()
    while watcher.is_alive():
        watcher.join(1.0)


if __name__ == "__main__":
    main()
