"""A real Prometheus server for the local fleet and the e2e tier: Debian's `prometheus`
package at a pinned version, fetched once by tools/prometheus/fetch.sh (unpacked, not
installed), run as a supervised process on loopback."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_api_client import PrometheusConnect

from inferfleet.devcluster import processes
from inferfleet.devcluster.processes import ProcessSpec

BINARY_VARIABLE = "INFERFLEET_PROMETHEUS"
FETCH_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "prometheus" / "fetch.sh"
_READY_TIMEOUT_S = 30.0


class PrometheusUnavailableError(RuntimeError):
    pass


def ensure_prometheus() -> Path:
    """The Prometheus binary: $INFERFLEET_PROMETHEUS, or the fetch script's cache (fetching
    the Debian package on first use)."""
    configured = os.environ.get(BINARY_VARIABLE)
    if configured:
        binary = Path(configured)
    elif FETCH_SCRIPT.exists():
        result = subprocess.run(
            ["bash", str(FETCH_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False
        )
        if result.returncode != 0:
            raise PrometheusUnavailableError(
                f"{FETCH_SCRIPT} failed with exit status {result.returncode}"
            )
        binary = Path(result.stdout.strip().splitlines()[-1])
    else:
        raise PrometheusUnavailableError(
            f"no Prometheus: set {BINARY_VARIABLE}, or run from a checkout that has "
            "tools/prometheus/fetch.sh"
        )
    if not binary.is_file():
        raise PrometheusUnavailableError(f"{binary} is not a file")
    return binary


def static_job(
    name: str, targets: Sequence[str], labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A scrape job over fixed `host:port` targets."""
    group: dict[str, Any] = {"targets": list(targets)}
    if labels:
        group["labels"] = dict(labels)
    return {"job_name": name, "static_configs": [group]}


def config_text(jobs: Sequence[Mapping[str, Any]], scrape_interval_s: float) -> str:
    interval = f"{int(scrape_interval_s * 1000)}ms"
    document = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [dict(job) for job in jobs],
    }
    return yaml.safe_dump(document, sort_keys=False)


@dataclass
class Prometheus:
    """A running Prometheus: its API at `url`, its files in `state_dir`."""

    pid: int
    port: int
    state_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(
        cls,
        state_dir: Path,
        jobs: Sequence[Mapping[str, Any]],
        *,
        scrape_interval_s: float = 1.0,
        binary: Path | None = None,
        bound_to_parent: bool = True,
    ) -> Prometheus:
        """Start scraping `jobs`; returns once the server says it is ready."""
        binary = binary or ensure_prometheus()
        state_dir.mkdir(parents=True, exist_ok=True)
        config = state_dir / "prometheus.yml"
        config.write_text(config_text(jobs, scrape_interval_s))
        port = processes.free_port()
        spec = ProcessSpec(
            "prometheus",
            (
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={state_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",  # POST /-/reload after a config change
                "--storage.tsdb.retention.time=1d",
            ),
        )
        pid = processes.start(spec, state_dir, bound_to_parent=bound_to_parent)
        server = cls(pid, port, state_dir)
        if not processes.wait_until(server.ready, _READY_TIMEOUT_S):
            server.stop()
            raise PrometheusUnavailableError(
                "Prometheus did not become ready:\n" + processes.log_tail(state_dir, "prometheus")
            )
        return server

    def ready(self) -> bool:
        if not processes.alive(self.pid):
            raise PrometheusUnavailableError(
                "Prometheus exited:\n" + processes.log_tail(self.state_dir, "prometheus")
            )
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def client(self) -> PrometheusConnect:
        return PrometheusConnect(url=self.url, disable_ssl=True)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        result: list[dict[str, Any]] = self.client().custom_query(query=promql)
        return result

    def scalar(self, promql: str) -> float | None:
        """The value of a query that returns one series; None when it returns none."""
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise ValueError(f"{promql} returned {len(result)} series, not one")
        return float(result[0]["value"][1])

    def stop(self) -> None:
        processes.stop([self.pid])
