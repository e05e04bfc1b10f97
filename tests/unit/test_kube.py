"""The Kubernetes client as the operator builds it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.config import kube_config

from inferfleet.kube import Kube

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "dev", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "admin", "user": {"token": "secret"}}],
    "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "admin"}}],
    "current-context": "dev",
}


def test_the_client_keeps_a_connection_open_for_every_thread_that_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request beyond the pool gets a connection that is closed after it: with more workers
    than the client's default pool (five per CPU), every write past it paid a TLS handshake."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    # $KUBECONFIG as the client read it when imported.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = Kube.from_environment(connections=36)
    assert kube.api_client.configuration.connection_pool_maxsize == 36
    assert kube.api_client.configuration.host == "https://127.0.0.1:6443"
