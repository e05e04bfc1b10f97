"""The dashboards and alerts the chart ships, against the real thing: the local fleet serves a
load step through a router while the operator autoscales it and exports its own metrics;
Prometheus scrapes routers, engines and the operator, and evaluates inferfleet's rules. Then
every dashboard query runs as Grafana runs it (a range query over the load, its variables set
to the service) and every rule's expression as an instant query: each evaluates without error
and returns data where the load produced some; the rules are loaded and evaluate healthy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from inferfleet.bench import traces
from inferfleet.devcluster.binaries import ensure_binaries
from inferfleet.devcluster.cluster import RULES_FILE, running
from inferfleet.devcluster.nodes import NodePool
from inferfleet.devcluster.processes import wait_until
from inferfleet.devcluster.prometheus import Prometheus
from tests.e2e.conftest import Kubectl
from tests.e2e.test_autoscaling import INPUT_TOKENS, OUTPUT_TOKENS, PORT, Fleet, _run, manifests
from tests.unit.test_observability import (
    GRAFANA_VARIABLES,
    RULES,
    dashboard_queries,
    load_rules,
    metric_names,
    rule_queries,
)

pytestmark = pytest.mark.timeout(600)

NAMESPACE, SERVICE = "observed", "chat"
# A load step up scales nothing down within the test.
SCALED_DOWN = "inferfleet-autoscaling.json: annotation Scaled down"
# Series that exist only once something goes wrong (a handler fails, a replica errors, a
# request is refused): a query over them alone may rightly return nothing after a clean run.
ONLY_ON_TROUBLE = frozenset(
    {
        "inferfleet_operator_reconcile_errors_total",
        "inferfleet_router_rejected_requests_total",
        "inferfleet_router_upstream_errors_total",
        "inferfleet_router_retries_total",
    }
)
# Series of services with tenants; the observed service has none.
ONLY_WITH_TENANTS = frozenset({"inferfleet_router_tenant_tokens_total"})


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Prometheus, int]]:
    """The local fleet as `dev-cluster up --with-fleet` runs it: Prometheus scrapes the
    operator's own metrics and evaluates the chart's rules from the start."""
    assert RULES_FILE.resolve() == RULES.resolve()
    bin_dir = ensure_binaries()
    with running(
        tmp_path_factory.mktemp("observability"), bin_dir, NodePool.parse("L4-24GB=2"),
        cpu_nodes=1, with_fleet=True, autoscale_interval_s=5.0, metrics_window_s=30.0,
    ) as cluster:  # fmt: skip
        state = cluster.state()
        assert state is not None
        assert state.prometheus_port is not None
        assert state.operator_metrics_port is not None
        prometheus = Prometheus(
            state.pids["prometheus"], state.prometheus_port, cluster.state_dir / "prometheus"
        )
        yield (
            Fleet(cluster, Kubectl(bin_dir / "kube", cluster.kubeconfig_path)),
            prometheus,
            state.operator_metrics_port,
        )


def grafana(expr: str) -> str:
    """A dashboard query as Grafana sends it with the variables set to the service."""
    values = GRAFANA_VARIABLES | {
        "$namespace": NAMESPACE,
        "$service": SERVICE,
        "$deployment": SERVICE,
    }
    for variable in sorted(values, key=len, reverse=True):
        expr = expr.replace(variable, values[variable])
    return expr


def rules_status(prometheus: Prometheus) -> list[dict[str, Any]]:
    groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10.0).json()["data"]["groups"]
    return [rule | {"group": group["name"]} for group in groups for rule in group["rules"]]


def test_every_dashboard_and_rule_query_returns_data_from_a_served_load(
    observed: tuple[Fleet, Prometheus, int],
) -> None:
    fleet, prometheus, metrics_port = observed
    client = PrometheusConnect(url=prometheus.url, disable_ssl=True)

    # The rules are loaded as the file has them, and the operator is a scrape target.
    loaded = rules_status(prometheus)
    names = sorted(r["name"] for r in loaded)
    assert names == sorted(str(r.get("record") or r.get("alert")) for _, r in load_rules())

    fleet.apply(NAMESPACE, manifests(SERVICE))
    router = fleet.router(NAMESPACE, SERVICE)
    # A load step past one replica's capacity: the autoscaler scales up (a decision to
    # annotate), the SLO is missed for a while (burn rates above zero).
    requests = traces.step(
        0.5, 3.0, 90.0, switch_s=20.0,
        input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS, seed=13,
    )  # fmt: skip
    started = datetime.now(UTC)
    results = asyncio.run(_run(f"http://{router}:{PORT}", requests))
    assert sum(r.ok for r in results) >= 0.9 * len(requests), fleet.diagnostics()
    time.sleep(3.0)  # the last scrapes of routers, engines and the operator
    ended = datetime.now(UTC)

    operator_up = prometheus.scalar(f'up{{instance="127.0.0.1:{metrics_port}"}}')
    assert operator_up == 1.0, httpx.get(f"{prometheus.url}/api/v1/targets", timeout=10).text

    failures: dict[str, str] = {}
    empty: list[str] = []
    counts: dict[str, int] = {}
    for query in dashboard_queries():
        expr = grafana(query.raw)
        try:
            result = client.custom_query_range(
                expr, start_time=started - timedelta(seconds=30), end_time=ended, step="5s"
            )
        except PrometheusApiClientException as error:
            failures[query.where] = f"{expr}: {error}"
            continue
        counts[query.where] = len(result)
        exempt = ONLY_ON_TROUBLE | ONLY_WITH_TENANTS
        if not result and not metric_names(expr) & exempt and query.where != SCALED_DOWN:
            empty.append(f"{query.where}: {expr}")
    print(f"\n{len(counts)} dashboard queries, series returned: {counts}")
    assert SCALED_DOWN in counts
    assert failures == {}
    assert empty == []

    alerts = {str(r["alert"]) for _, r in load_rules() if "alert" in r}
    for query in rule_queries():
        try:
            result = client.custom_query(query.expr)
        except PrometheusApiClientException as error:
            failures[query.where] = f"{query.expr}: {error}"
            continue
        name = query.where.split(": ", 1)[1]
        # Recorded series must exist after the load; an alert's expression is empty unless
        # it fires, and what fires after a load step is not this test's business.
        if name not in alerts and not result:
            empty.append(f"{query.where}: {query.expr}")
    assert failures == {}
    assert empty == []

    # Prometheus evaluates every rule without error (health ok, once evaluated).
    assert wait_until(
        lambda: all(rule["health"] == "ok" for rule in rules_status(prometheus)), 15, 1
    ), [(r["name"], r["health"], r.get("lastError")) for r in rules_status(prometheus)]
    firing = [
        (r["name"], a["labels"].get("service"))
        for r in rules_status(prometheus)
        for a in r.get("alerts", [])
    ]
    print(f"alerts pending or firing after the step: {firing}")

    # The operator's own series say what the service's status says.
    service = fleet.get("infsvc", SERVICE, NAMESPACE)
    [replicas] = [r for r in service["status"]["replicas"] if r["role"] == "aggregated"]
    desired = prometheus.scalar(
        f'inferfleet_autoscaler_desired_replicas{{namespace="{NAMESPACE}",'
        f'service="{SERVICE}",role="aggregated"}}'
    )
    assert desired == replicas["replicas"]
    decided_up = prometheus.scalar(
        f'sum(inferfleet_autoscaler_decisions_total{{namespace="{NAMESPACE}",direction="up"}})'
    )
    assert decided_up is not None
    assert decided_up >= 1
