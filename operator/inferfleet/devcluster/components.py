"""The dev cluster's control plane as command lines: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, with the ports, certificates and client
limits they are given, and the kubeconfigs that reach them. Pure: what `DevCluster.up`
starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from inferfleet.devcluster import pki, processes
from inferfleet.devcluster.processes import ProcessSpec

SERVICE_CIDR = "10.96.0.0/16"
# Pods on fake nodes get loopback addresses, so a process bound to a pod's IP is reachable.
POD_CIDR = "127.1.0.0/16"

# Controllers an inference fleet needs; node IPAM and cloud controllers are pointless here.
CONTROLLERS = (
    "garbage-collector-controller",
    "deployment-controller",
    "replicaset-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "endpoints-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "resourcequota-controller",
    "disruption-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "pod-garbage-collector-controller",
    "job-controller",
    "persistentvolume-binder-controller",
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    "statefulset-controller",
    "daemonset-controller",
    "clusterrole-aggregation-controller",
    "root-ca-certificate-publisher-controller",
)


@dataclass(frozen=True)
class ClientRateLimit:
    """The client-side limit of the controller manager's and the scheduler's API requests
    (`--kube-api-qps`, `--kube-api-burst`). Unset, they keep their defaults (20/30 and 50/100),
    which at hundreds of Deployments make them, not what they serve, the bottleneck."""

    qps: float
    burst: int

    def flags(self) -> tuple[str, ...]:
        return (f"--kube-api-qps={self.qps:g}", f"--kube-api-burst={self.burst}")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(*processes.free_ports(6))


def kubeconfig(
    server: str, ca: Path, user: pki.Pair, name: str = "inferfleet-dev"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": name,
                "user": {"client-certificate": str(user.cert), "client-key": str(user.key)},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


_READY_BY_KWOK: Final = (
    '        status: "True"\n        type: Ready\n',
    '        status: "True"\n        type: ContainersReady\n',
)
_PROBED: Final = (
    "{{ $probed := false }}{{ range .spec.containers }}{{ if .readinessProbe }}"
    "{{ $probed = true }}{{ end }}{{ end }}"
)


_JOB_POD = """    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
"""
_NOT_RUN_BY_THE_FLEET = """    - key: '.spec.containers[0].command[1]'
      operator: 'NotIn'
      values:
      - 'weights'
"""


def fleet_pod_stages(stages: str) -> str:
    """kwok's stages with a pod that has a readiness probe turning Running unready, as a
    kubelet starts it, for the fleet agent to make ready once its probe passes (kwok's own
    stage marks every pod Ready at once: a Deployment rolling out then takes a new pod for
    available before anything answers, and replaces every old replica at once); and with a
    Job's pod that the agent runs (`inferfleet weights`) left to end as its process ends
    (kwok's own stage completes every Job's pod at once).

    Raises ValueError when kwok's pod-ready or pod-complete stage is not the one this edits."""
    if stages.count(_JOB_POD) != 1:
        raise ValueError("kwok's pod-complete stage does not select Jobs' pods as expected")
    edited = stages.replace(_JOB_POD, _JOB_POD + _NOT_RUN_BY_THE_FLEET)
    for ready in _READY_BY_KWOK:
        if edited.count(ready) != 1:
            raise ValueError(f"kwok's pod-ready stage does not set {ready.strip()!r} once")
        probed = ready.replace('"True"', '{{ if $probed }}"False"{{ else }}"True"{{ end }}')
        edited = edited.replace(ready, probed)
    start = "      {{ $now := Now }}\n\n      conditions:\n"
    if edited.count(start) != 1:
        raise ValueError("kwok's pod-ready stage does not begin its conditions as expected")
    edited = edited.replace(
        start, f"      {{{{ $now := Now }}}}\n      {_PROBED}\n\n      conditions:\n"
    )
    container_ready = "        name: {{ .name | Quote }}\n        ready: true\n"
    if edited.count(container_ready) < 1:
        raise ValueError("kwok's pod-ready stage does not mark its containers ready")
    return edited.replace(
        container_ready,
        "        name: {{ .name | Quote }}\n"
        "        ready: {{ if .readinessProbe }}false{{ else }}true{{ end }}\n",
        1,
    )


def component_specs(
    bin_dir: Path,
    state_dir: Path,
    ports: Ports,
    certs: pki.ClusterPki,
    client_rate: ClientRateLimit | None = None,
    *,
    stages: Path | None = None,
) -> list[ProcessSpec]:
    """The command line of every component (pure: what `up` starts); `stages`: kwok's stages
    file, where not the built one."""
    kube = str(bin_dir / "kube")
    rate_flags = client_rate.flags() if client_rate else ()
    kubeconfigs = state_dir / "kubeconfigs"
    serving = [
        f"--tls-cert-file={certs.apiserver.cert}",
        f"--tls-private-key-file={certs.apiserver.key}",
    ]
    etcd_client = f"http://127.0.0.1:{ports.etcd_client}"
    etcd_peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        ProcessSpec(
            "etcd",
            (
                str(bin_dir / "etcd"),
                "--name=dev",
                f"--data-dir={state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_client}",
                f"--advertise-client-urls={etcd_client}",
                f"--listen-peer-urls={etcd_peer}",
                f"--initial-advertise-peer-urls={etcd_peer}",
                f"--initial-cluster=dev={etcd_peer}",
                # A throwaway cluster: durability on power loss is not worth the fsync latency.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ),
        ),
        ProcessSpec(
            "kube-apiserver",
            (
                kube,
                "kube-apiserver",
                f"--etcd-servers={etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The `kubernetes` Service cannot have a loopback endpoint; nothing needs it here.
                "--endpoint-reconciler-type=none",
                f"--secure-port={ports.apiserver}",
                *serving,
                f"--client-ca-file={certs.ca.cert}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={certs.service_account_public}",
                f"--service-account-signing-key-file={certs.service_account_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NamespaceLifecycle,LimitRanger,ServiceAccount,"
                "DefaultTolerationSeconds,Priority,ResourceQuota,ValidatingAdmissionPolicy,"
                "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                "--allow-privileged=true",
                f"--audit-policy-file={state_dir / 'audit-policy.yaml'}",
                f"--audit-log-path={state_dir / 'logs' / 'audit.log'}",
                "--audit-log-maxsize=100",
                "--profiling=false",
            ),
        ),
        ProcessSpec(
            "kube-controller-manager",
            (
                kube,
                "kube-controller-manager",
                f"--kubeconfig={kubeconfigs / 'controller-manager.yaml'}",
                f"--authentication-kubeconfig={kubeconfigs / 'controller-manager.yaml'}",
                f"--authorization-kubeconfig={kubeconfigs / 'controller-manager.yaml'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.controller_manager}",
                *serving,
                "--controllers=" + ",".join(CONTROLLERS),
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={certs.service_account_key}",
                f"--root-ca-file={certs.ca.cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                # Its default lies under /usr/libexec, outside the state directory.
                f"--flex-volume-plugin-dir={state_dir / 'flexvolume'}",
                # Fake nodes never die; evict quickly when a test stops kwok on purpose.
                "--node-monitor-grace-period=20s",
                *rate_flags,
            ),
        ),
        ProcessSpec(
            "kube-scheduler",
            (
                kube,
                "kube-scheduler",
                f"--kubeconfig={kubeconfigs / 'scheduler.yaml'}",
                f"--authentication-kubeconfig={kubeconfigs / 'scheduler.yaml'}",
                f"--authorization-kubeconfig={kubeconfigs / 'scheduler.yaml'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports.scheduler}",
                *serving,
                "--leader-elect=false",
                *rate_flags,
            ),
        ),
        ProcessSpec(
            "kwok",
            (
                str(bin_dir / "kwok"),
                f"--kubeconfig={kubeconfigs / 'kwok.yaml'}",
                # Stages: how nodes turn Ready and keep their lease, and how pods turn Running.
                f"--config={stages or bin_dir / 'kwok-stages.yaml'}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--server-address=127.0.0.1:{ports.kwok}",
                f"--cidr={POD_CIDR}",
                "--node-ip=127.0.0.1",
                # The heartbeat stage renews node leases; without a duration nodes go NotReady.
                "--node-lease-duration-seconds=40",
            ),
            # Keeps kwok from reading ~/.kwok of whoever runs the cluster.
            env={"KWOK_WORKDIR": str(state_dir / "kwok")},
        ),
    ]
