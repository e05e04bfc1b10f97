"""The launch of a TensorRT-LLM replica over several nodes, run for real: the leader's and the
workers' scripts under `sh`, with the keys the operator generates. `mpirun` is a stub that
records its command line (no MPI or GPU here); `ssh` and `sshd` are OpenSSH's, on loopback,
where the machine has them as root (the daemon's privilege separation needs root)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferfleet.devcluster.processes import free_port, wait_until
from inferfleet.engines.multinode import (
    SSH_CAPABILITIES,
    SSH_HOST_KEY_ALIAS,
    SSH_KEYS_CLIENT,
    SSH_KEYS_CLIENT_PUBLIC,
    SSH_KEYS_DIR,
    SSH_KEYS_HOST,
    SSH_KEYS_HOST_PUBLIC,
    SSH_PORT,
    leader_script,
    worker_script,
)
from inferfleet.kube import RefusedError
from inferfleet.reconcile.desired import ObjectKey
from inferfleet.reconcile.generated import (
    RECREATE_CHECK_S,
    GeneratedSecrets,
    ssh_keys,
    with_generated_data,
)
from inferfleet.render.multinode import GENERATED_DATA_ANNOTATION, SSH_KEYS

RUN_DIR = "/run/mpi-ssh"
LEADER = "llama-405b-aggregated-group-0.llama-405b-aggregated-group.llm"
WORKER_1 = "llama-405b-aggregated-group-0-1.llama-405b-aggregated-group.llm"


def write_keys(directory: Path, keys: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in keys.items():
        (directory / name).write_text(text)
        (directory / name).chmod(0o400)
    return directory


def stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def localised(script: str, *, keys: Path, run: Path, port: int = SSH_PORT) -> str:
    """The script with this test's directories and port for the pod's."""
    return (
        script.replace(SSH_KEYS_DIR, str(keys))
        .replace(RUN_DIR, str(run))
        .replace(str(SSH_PORT), str(port))
    )


def recorded(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1]


def test_the_generated_keys_are_openssh_key_pairs() -> None:
    keys = ssh_keys("llm/llama-405b-mpi-ssh")
    assert set(keys) == {
        SSH_KEYS_CLIENT, SSH_KEYS_CLIENT_PUBLIC, SSH_KEYS_HOST, SSH_KEYS_HOST_PUBLIC
    }  # fmt: skip
    for private, public in ((SSH_KEYS_CLIENT, SSH_KEYS_CLIENT_PUBLIC), (SSH_KEYS_HOST,
                            SSH_KEYS_HOST_PUBLIC)):  # fmt: skip
        assert keys[private].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
        assert keys[public].startswith("ssh-ed25519 ")
        assert keys[public].endswith(" llm/llama-405b-mpi-ssh\n")
    assert keys[SSH_KEYS_CLIENT] != keys[SSH_KEYS_HOST]
    assert ssh_keys("x")[SSH_KEYS_CLIENT] != keys[SSH_KEYS_CLIENT], "random, not derived"


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="OpenSSH's ssh-keygen")
def test_openssh_reads_each_private_key_as_the_pair_of_its_public_key(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys", ssh_keys("c"))
    for private, public in ((SSH_KEYS_CLIENT, SSH_KEYS_CLIENT_PUBLIC), (SSH_KEYS_HOST,
                            SSH_KEYS_HOST_PUBLIC)):  # fmt: skip
        derived = subprocess.run(
            ["ssh-keygen", "-y", "-f", str(keys / private)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert derived.split()[:2] == (keys / public).read_text().split()[:2]


def test_a_secret_gets_keys_only_where_its_annotation_asks_for_them() -> None:
    secret: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "m-mpi-ssh",
            "namespace": "llm",
            "annotations": {GENERATED_DATA_ANNOTATION: SSH_KEYS},
        },
        "type": "Opaque",
    }
    filled = with_generated_data(secret)
    assert set(filled["stringData"]) == {
        SSH_KEYS_CLIENT, SSH_KEYS_CLIENT_PUBLIC, SSH_KEYS_HOST, SSH_KEYS_HOST_PUBLIC
    }  # fmt: skip
    assert "stringData" not in secret
    other = {**secret, "metadata": {**secret["metadata"], "annotations": {}}}
    with pytest.raises(ValueError, match="nothing known to generate"):
        with_generated_data(other)


def test_a_generated_secret_is_created_once_and_again_only_if_gone_for_long() -> None:
    """Each reconcile of its owner hands the Secret over; it is created at the first, not at
    the next (one request saved per reconcile), again once `RECREATE_CHECK_S` has passed (one
    deleted by hand comes back; one that exists answers 409, found), and per owner uid."""
    now = [0.0]
    created: list[dict[str, Any]] = []

    def create(obj: dict[str, Any]) -> bool:
        created.append(obj)
        return len(created) == 1

    def secret(uid: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {
                "name": f"m-mpi-ssh-{uid}", "namespace": "llm",
                "annotations": {GENERATED_DATA_ANNOTATION: SSH_KEYS},
                "ownerReferences": [{"uid": uid}],
            },
        }  # fmt: skip

    generated = GeneratedSecrets(clock=lambda: now[0])
    generated.ensure(secret("a"), create)
    generated.ensure(secret("a"), create)
    assert len(created) == 1
    assert set(created[0]["stringData"]) == {
        SSH_KEYS_CLIENT, SSH_KEYS_CLIENT_PUBLIC, SSH_KEYS_HOST, SSH_KEYS_HOST_PUBLIC
    }  # fmt: skip
    generated.ensure(secret("b"), create)
    assert len(created) == 2, "another owner's"
    now[0] = RECREATE_CHECK_S
    generated.ensure(secret("a"), create)
    assert len(created) == 3, "looked for again"
    generated.ensure(secret("a"), create)
    assert len(created) == 3

    def refused(obj: dict[str, Any]) -> bool:
        raise PermissionError("secrets is forbidden")

    # A create that fails (a grant missing, the API server away) is tried again next time.
    with pytest.raises(PermissionError):
        generated.ensure(secret("c"), refused)
    generated.ensure(secret("c"), create)
    assert created[-1]["metadata"]["name"] == "m-mpi-ssh-c"
    # Retired (its owner no longer renders it): deleted by name, unread, and created at once
    # when needed again; a delete the RBAC does not grant leaves it, and nothing fails.
    deleted: list[tuple[str, str, str, str | None]] = []

    def delete(api_version: str, kind: str, name: str, namespace: str | None) -> None:
        deleted.append((api_version, kind, name, namespace))

    key = ObjectKey("v1", "Secret", "m-mpi-ssh-c")
    generated.retire(key, "llm", "c", delete)
    assert deleted == [("v1", "Secret", "m-mpi-ssh-c", "llm")]
    created.clear()
    generated.ensure(secret("c"), create)
    assert [c["metadata"]["name"] for c in created] == ["m-mpi-ssh-c"]

    def not_granted(api_version: str, kind: str, name: str, namespace: str | None) -> None:
        raise RefusedError("secrets is forbidden")

    generated.retire(key, "llm", "c", not_granted)


def test_the_leader_waits_for_each_worker_then_runs_mpirun_over_the_whole_group(
    tmp_path: Path,
) -> None:
    keys = write_keys(tmp_path / "keys", ssh_keys("c"))
    run, bin_dir, log = tmp_path / "run", tmp_path / "bin", tmp_path / "log"
    log.mkdir()
    # Worker 1's daemon answers at the second try; worker 2's at once.
    stub(
        bin_dir,
        "ssh",
        f'host=""; for a in "$@"; do case "$a" in *.llm) host="$a";; esac; done\n'
        f'echo "$host" >> {log}/ssh\n'
        f'[ "$host" != "{WORKER_1}" ] && exit 0\n'
        f"[ -e {log}/tried ] && exit 0\ntouch {log}/tried\nexit 255",
    )
    stub(bin_dir, "mpirun", f'for a in "$@"; do printf \'%s\\0\' "$a"; done > {log}/mpirun')
    script = localised(leader_script(8, 60), keys=keys, run=run)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "LWS_LEADER_ADDRESS": LEADER,
        "LWS_GROUP_SIZE": "3",
        "LWS_WORKER_INDEX": "0",
        "HOSTNAME": "leader-pod",
        "HF_TOKEN": "hf_x",
    }
    subprocess.run(
        ["sh", "-c", script, "mpi-leader", "trtllm-serve", "meta-llama/Llama-3.1-405B",
         "--tp_size", "8", "--pp_size", "3"],
        env=env, check=True, timeout=60,
    )  # fmt: skip
    workers = [WORKER_1, WORKER_1.replace("-0-1.", "-0-2.")]
    assert (log / "ssh").read_text().split() == [workers[0], workers[0], workers[1]]
    argv = recorded(log / "mpirun")
    # The leader by the name it knows itself by (no SSH to it), the workers by their full names.
    assert argv[:5] == ["--allow-run-as-root", "-np", "24", "-H", f"{os.uname().nodename}:8,"
                        + ",".join(f"{w}:8" for w in workers)]  # fmt: skip
    launch = argv.index("trtllm-llmapi-launch")
    assert argv[launch:] == [
        "trtllm-llmapi-launch", "trtllm-serve", "meta-llama/Llama-3.1-405B",
        "--tp_size", "8", "--pp_size", "3",
    ]  # fmt: skip
    # The leader's environment but for its own pod's variables; the ssh options are its own.
    forwarded = [argv[i + 1] for i in range(launch) if argv[i] == "-x"]
    assert "HF_TOKEN" in forwarded
    assert "PATH" in forwarded
    assert not {"HOSTNAME", "LWS_WORKER_INDEX", "LWS_LEADER_ADDRESS"} & set(forwarded)
    rsh = argv[argv.index("plm_rsh_args") + 1]
    assert f"HostKeyAlias={SSH_HOST_KEY_ALIAS}" in rsh
    assert "StrictHostKeyChecking=yes" in rsh
    # The host key every worker serves is the only one the leader accepts.
    host_public = (keys / SSH_KEYS_HOST_PUBLIC).read_text()
    assert (run / "known_hosts").read_text() == f"{SSH_HOST_KEY_ALIAS} {host_public}"
    assert (run / "id").stat().st_mode & 0o777 == 0o600


def test_the_leader_gives_up_on_a_worker_that_never_answers(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys", ssh_keys("c"))
    bin_dir = tmp_path / "bin"
    stub(bin_dir, "ssh", "exit 255")
    stub(bin_dir, "mpirun", "exit 0")
    script = localised(leader_script(8, 1), keys=keys, run=tmp_path / "run")
    done = subprocess.run(
        ["sh", "-c", script, "mpi-leader", "trtllm-serve"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_LEADER_ADDRESS": LEADER,
             "LWS_GROUP_SIZE": "2"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"no SSH answer on port {SSH_PORT}" in done.stderr


def test_a_worker_without_an_ssh_server_says_which_image_to_use(tmp_path: Path) -> None:
    keys = write_keys(tmp_path / "keys", ssh_keys("c"))
    script = localised(worker_script(), keys=keys, run=tmp_path / "run").replace(
        "/usr/sbin/sshd", str(tmp_path / "no-sshd")
    )
    done = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1
    assert "runtime_images/tensorrt-llm" in done.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (tools/system-packages.sh)")
def test_open_mpi_starts_each_workers_daemon_by_full_name_and_absolute_path(
    tmp_path: Path,
) -> None:
    """Open MPI's own mpirun, its SSH recorded instead of made: it reaches each worker by the
    name that resolves in a pod (not the first label it keeps by default), not the leader
    (itself), and runs the daemon there by the path mpirun came from (an SSH session has no
    PATH of the image's)."""
    keys = write_keys(tmp_path / "keys", ssh_keys("c"))
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    log.mkdir()
    # The wait for each daemon answers; mpirun's own start of the daemons is recorded.
    stub(
        bin_dir,
        "ssh",
        f'for a in "$@"; do last="$a"; done\n[ "$last" = true ] && exit 0\n'
        f'for a in "$@"; do printf \'%s\\0\' "$a"; done >> {log}/ssh\nexit 1',
    )
    script = localised(leader_script(2, 60), keys=keys, run=tmp_path / "run")
    subprocess.run(
        ["sh", "-c", script, "mpi-leader", "true"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_LEADER_ADDRESS": LEADER,
             "LWS_GROUP_SIZE": "2", "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    argv = recorded(log / "ssh")
    assert WORKER_1 in argv
    assert os.uname().nodename not in argv
    remote = argv[argv.index(WORKER_1) + 1 :]
    mpirun = Path(str(shutil.which("mpirun")))
    assert any(f"{mpirun.parent}/orted" in word for word in remote), remote
    assert f"HostKeyAlias={SSH_HOST_KEY_ALIAS}" in argv


# The real daemon.


@pytest.fixture
def root_run_dir() -> Iterator[Path]:
    """A directory under /run: sshd refuses keys below a directory others may write (/tmp)."""
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists() or shutil.which("ssh") is None:
        pytest.skip("needs root and OpenSSH's server and client (tools/system-packages.sh)")
    path = Path(tempfile.mkdtemp(prefix="inferfleet-mpi-", dir="/run"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


CONTAINER_CAPABILITIES = [
    "setpriv", "--no-new-privs", "--inh-caps=-all",
    "--bounding-set=-all," + ",".join(f"+{c.lower()}" for c in SSH_CAPABILITIES),
]  # fmt: skip
"""The worker container's process as the kubelet starts it: root with every capability dropped
but the daemon's, and no privilege escalation (util-linux's setpriv)."""


def start_worker(base: Path, keys: Path, port: int) -> subprocess.Popen[str]:
    script = localised(worker_script(), keys=keys, run=base / "worker", port=port)
    daemon = subprocess.Popen(
        [*CONTAINER_CAPABILITIES, "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip

    def listening() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0 or daemon.poll() is not None

    if wait_until(listening, 10, 0.05) and daemon.poll() is None:
        return daemon
    daemon.kill()
    raise AssertionError(f"sshd did not listen: {daemon.communicate()[0]}")


def lead(base: Path, keys: Path, port: int, *, wait_s: int) -> subprocess.CompletedProcess[str]:
    """The leader's script against the worker on loopback (whatever the address, ssh connects
    to 127.0.0.1; the host key is looked up by its alias, not the address)."""
    bin_dir = base / "bin"
    stub(bin_dir, "ssh", 'exec /usr/bin/ssh -o HostName=127.0.0.1 "$@"')
    stub(bin_dir, "mpirun", f"echo launched > {base}/launched")
    script = localised(leader_script(8, wait_s), keys=keys, run=base / "leader", port=port)
    return subprocess.run(
        ["sh", "-c", script, "mpi-leader", "trtllm-serve"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "LWS_LEADER_ADDRESS": LEADER,
             "LWS_GROUP_SIZE": "2", "HOME": str(base)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_the_leader_reaches_a_worker_daemon_with_the_groups_keys(root_run_dir: Path) -> None:
    keys = write_keys(root_run_dir / "keys", ssh_keys("llm/llama-405b-mpi-ssh"))
    port = free_port()
    daemon = start_worker(root_run_dir, keys, port)
    try:
        done = lead(root_run_dir, keys, port, wait_s=20)
    finally:
        daemon.kill()
        log = daemon.communicate()[0]
    assert done.returncode == 0, done.stderr + log
    assert (root_run_dir / "launched").read_text() == "launched\n"


def test_the_leader_refuses_a_worker_with_another_host_key(root_run_dir: Path) -> None:
    """One that answers on the address with a key not the group's is not taken on trust."""
    leader_keys = write_keys(root_run_dir / "keys", ssh_keys("group"))
    impostor = ssh_keys("impostor") | {
        SSH_KEYS_CLIENT_PUBLIC: (leader_keys / SSH_KEYS_CLIENT_PUBLIC).read_text()
    }
    port = free_port()
    daemon = start_worker(root_run_dir, write_keys(root_run_dir / "other", impostor), port)
    try:
        done = lead(root_run_dir, leader_keys, port, wait_s=3)
    finally:
        daemon.kill()
        daemon.communicate()
    assert done.returncode == 1
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in done.stderr or (
        "Host key verification failed" in done.stderr
    )
    assert not (root_run_dir / "launched").exists()
