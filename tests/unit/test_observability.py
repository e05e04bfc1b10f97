"""What an SRE reads: the Grafana dashboards and the Prometheus rules shipped in the chart, and
the operator's own metrics they read. Every query parses (promtool, and a PromQL parser that
lists the metrics it names), names only metrics the code exports, and every alert fires and
stays silent where promtool's rule unit tests say it must. tests/e2e/test_observability.py runs
the same queries against a real Prometheus."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from inferfleet.api.inference_service import SloSpec
from inferfleet.api.model_deployment import Role
from inferfleet.autoscale.controller import AutoscalerSettings, tick
from inferfleet.autoscale.metrics import (
    KOPF_OBJECT_LOGGER,
    OperatorMetrics,
    ReconcileErrorCounter,
    RoleRecord,
    TickRecord,
    registry_of,
)
from inferfleet.devcluster.processes import free_port
from inferfleet.devcluster.prometheus import ensure_prometheus
from inferfleet.reconcile.controller import Controller, Done
from inferfleet.reconcile.operator import serve_metrics
from inferfleet.reconcile.workqueue import WorkQueue
from inferfleet.render import InstallSettings
from inferfleet.router.metrics import RouterMetrics
from inferfleet.sim.metrics import EngineMetrics
from inferfleet.sim.scheduler import EngineStats
from tests.unit.test_autoscale_controller import (
    NOW,
    SETTINGS,
    Scripted,
    busy,
    inference_service,
    model_deployment,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "charts" / "inferfleet" / "dashboards"
RULES = ROOT / "charts" / "inferfleet" / "rules" / "inferfleet.rules.yaml"
RUNBOOKS = RULES.with_name("runbooks.md")
RULE_TESTS = ROOT / "tests" / "unit" / "rules" / "inferfleet.rules.test.yaml"
GRAFANA_SCHEMA_VERSION = 41
"""Grafana 12's dashboard schema version."""

# What Grafana substitutes before a query reaches Prometheus, with values that select
# everything (as the variables' "All" does) and windows as a 15 s scrape interval gives them.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
    "$namespace": ".*",
    "$service": ".*",
    "$deployment": ".*",
}
IDLE_ENGINE = EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0, 0, 0.0)
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>[a-zA-Z_]\w*)\)$")


@dataclass(frozen=True)
class Query:
    where: str
    """Dashboard file and panel (or rule group and name), for messages."""
    raw: str
    """PromQL as the dashboard (or rule file) has it, Grafana's variables in it."""

    @property
    def expr(self) -> str:
        """PromQL as Prometheus receives it, the variables set to "All"."""
        return substitute(self.raw)


def substitute(expr: str) -> str:
    for variable in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(variable, GRAFANA_VARIABLES[variable])
    return expr


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def dashboard_queries() -> list[Query]:
    """Every PromQL query of every dashboard: panel targets, annotations, and the selectors
    of the variables' `label_values(...)`."""
    found = []
    for name, dashboard in load_dashboards().items():
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                where = f"{name}: {panel['title']} ({target['refId']})"
                found.append(Query(where, target["expr"]))
        for annotation in dashboard["annotations"]["list"]:
            if "expr" in annotation:
                found.append(Query(f"{name}: annotation {annotation['name']}", annotation["expr"]))
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                match = _LABEL_VALUES.match(variable["query"]["query"])
                assert match, f"{name}: variable {variable['name']}: {variable['query']}"
                found.append(Query(f"{name}: variable {variable['name']}", match["selector"]))
    return found


def load_rules() -> list[tuple[str, dict[str, Any]]]:
    document = yaml.safe_load(RULES.read_text())
    return [(group["name"], rule) for group in document["groups"] for rule in group["rules"]]


def rule_queries() -> list[Query]:
    return [
        Query(f"{group}: {rule.get('record') or rule.get('alert')}", rule["expr"])
        for group, rule in load_rules()
    ]


def metric_names(expr: str) -> set[str]:
    """The metric names a query selects, from its syntax tree."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            names.add(node.name)
        elif isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, promql_parser.Call):
            for argument in node.args:
                walk(argument)
        elif isinstance(
            node,
            promql_parser.AggregateExpr
            | promql_parser.ParenExpr
            | promql_parser.UnaryExpr
            | promql_parser.SubqueryExpr,
        ):
            walk(node.expr)

    walk(promql_parser.parse(expr))
    return names


SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
    "info": ("_info",),
}


def sample_names(registry: CollectorRegistry) -> set[str]:
    """The names of a registry's series, also those of labelled families with no child yet."""
    names = set()
    for family in registry.collect():
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SERIES_SUFFIXES.get(family.type, ())}
    return names


def exported_metrics() -> set[str]:
    """Every series name the code exports, read from the exporters themselves: the router's,
    the engines' (vLLM's names, as the emulator exports them), the operator's, and what
    Prometheus adds (`up`) or the rules record."""
    router = RouterMetrics("chat")
    router.declare("d")
    engine = EngineMetrics(
        "m", lambda: IDLE_ENGINE, max_model_len=8192, block_size=16, num_gpu_blocks=100
    )
    engine_registry = CollectorRegistry(auto_describe=False)
    engine_registry.register(engine)
    operator = OperatorMetrics(clock=lambda: 0.0)
    operator.record(tick_record(at_s=0.0))
    operator.reconcile_failed("ModelDeployment")
    recorded = {rule["record"] for _, rule in load_rules() if "record" in rule}
    return (
        sample_names(router.registry)
        | sample_names(engine_registry)
        | sample_names(registry_of(operator))
        | recorded
        | {"up"}
    )


def tick_record(at_s: float = 1000.0, **changes: Any) -> TickRecord:
    role = RoleRecord(
        deployment="llama",
        role=Role.AGGREGATED,
        current=2,
        desired=3,
        min_replicas=1,
        max_replicas=8,
        gpus_per_replica=2,
        gpu_hourly_price_usd=2.5,
        reason="ScaleUpLoad",
    )
    fields: dict[str, Any] = {
        "namespace": "serving",
        "service": "chat",
        "at_s": at_s,
        "metrics_available": True,
        "newest_sample_age_s": 4.0,
        "slo_attainment_target": 0.95,
        "roles": (role,),
    }
    return TickRecord(**(fields | changes))


@pytest.fixture(scope="module")
def promtool() -> Path:
    """From the same unpacked Debian package as the server (tools/prometheus/fetch.sh)."""
    return ensure_prometheus().with_name("promtool")


# The dashboards.


def test_dashboards_are_grafana_dashboards_with_a_datasource_and_variables() -> None:
    dashboards = load_dashboards()
    assert len(dashboards) >= 5, sorted(dashboards)
    uids = [d["uid"] for d in dashboards.values()]
    assert len(set(uids)) == len(uids)
    for name, dashboard in dashboards.items():
        assert dashboard["schemaVersion"] == GRAFANA_SCHEMA_VERSION, name
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        assert "namespace" in variables, name
        ids = [panel["id"] for panel in dashboard["panels"]]
        assert len(set(ids)) == len(ids), name
        for panel in dashboard["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            assert panel["description"], (name, panel["title"])
            for target in [panel, *panel["targets"]]:
                assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"]["uid"] == "${datasource}", name


def test_the_autoscaling_dashboard_annotates_scaling_decisions() -> None:
    """From the desired replicas, which exist from a service's first tick: a decision counter
    is born at 1 when its first scale-up happens, and `increase` never sees that one."""
    dashboard = load_dashboards()["inferfleet-autoscaling.json"]
    up, down = [a for a in dashboard["annotations"]["list"] if "expr" in a]
    for annotation, comparison in ((up, "> 0"), (down, "< 0")):
        assert "inferfleet_autoscaler_desired_replicas" in annotation["expr"]
        assert "offset $__interval" in annotation["expr"]
        assert annotation["expr"].endswith(comparison)


def test_every_dashboard_query_parses_in_prometheus(promtool: Path, tmp_path: Path) -> None:
    """promtool parses each query as Prometheus does (as the expression of a recording rule)."""
    queries = dashboard_queries()
    rules = [{"record": f"dashboard:query_{i}", "expr": q.expr} for i, q in enumerate(queries)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_dashboards_and_rules_name_only_metrics_the_code_exports() -> None:
    exported = exported_metrics()
    unknown = {
        query.where: sorted(metric_names(query.expr) - exported)
        for query in dashboard_queries() + rule_queries()
    }
    assert {where: names for where, names in unknown.items() if names} == {}


def test_every_operator_metric_is_on_a_dashboard_or_in_a_rule() -> None:
    operator = OperatorMetrics(clock=lambda: 0.0)
    operator.record(tick_record(at_s=0.0))
    operator.reconcile_failed("InferenceService")
    used = set().union(*(metric_names(q.expr) for q in dashboard_queries() + rule_queries()))
    assert sample_names(registry_of(operator)) - used == set()


def test_the_cost_panel_computes_what_status_observed_reports() -> None:
    """Replicas x GPUs per replica x the GPU's price per hour, over decoded tokens."""
    dashboard = load_dashboards()["inferfleet-cost.json"]
    [cost] = [p for p in dashboard["panels"] if p["title"] == "Cost per 1M output tokens"]
    names = metric_names(substitute(cost["targets"][0]["expr"]))
    assert names == {
        "inferfleet_autoscaler_desired_replicas",
        "inferfleet_autoscaler_gpus_per_replica",
        "inferfleet_autoscaler_gpu_hourly_price_usd",
        "vllm:generation_tokens_total",
    }


def test_the_tenant_cost_panel_shares_the_hourly_cost_by_weighted_tokens(
    promtool: Path, tmp_path: Path
) -> None:
    """Evaluated by promtool over series as the operator and the router export them: two
    tenants, one served 3 prompt and 1 output token a second, the other 1 and 1 (weighted 5
    and 3), on a service holding two GPUs at 2.5 USD an hour: 5/8 and 3/8 of 5 USD."""
    dashboard = load_dashboards()["inferfleet-cost.json"]
    [panel] = [p for p in dashboard["panels"] if p["title"] == "Hourly cost per tenant"]
    expr = substitute(panel["targets"][0]["expr"].replace("$__rate_interval", "3m"))
    labels = 'namespace="ns",service="chat"'
    autoscaler = f'{labels},deployment="llama",role="aggregated"'

    def counter(tenant: str, kind: str, per_s: int) -> dict[str, str]:
        return {
            "series": f'inferfleet_router_tenant_tokens_total{{{labels},tenant="{tenant}",'
            f'kind="{kind}"}}',
            "values": f"0+{per_s * 60}x10",
        }

    tests = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f"inferfleet_autoscaler_desired_replicas{{{autoscaler}}}",
                        "values": "2x10",
                    },
                    {
                        "series": f"inferfleet_autoscaler_gpus_per_replica{{{autoscaler}}}",
                        "values": "1x10",
                    },
                    {
                        "series": f"inferfleet_autoscaler_gpu_hourly_price_usd{{{autoscaler}}}",
                        "values": "2.5x10",
                    },
                    counter("search", "prompt", 3),
                    counter("search", "output", 1),
                    counter("etl", "prompt", 1),
                    counter("etl", "output", 1),
                ],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": f'{{{labels},tenant="search"}}', "value": 5 * 5 / 8},
                            {"labels": f'{{{labels},tenant="etl"}}', "value": 5 * 3 / 8},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "tenant_cost_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [str(promtool), "test", "rules", path.name],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# The rules.


def test_rules_pass_promtool_check(promtool: Path) -> None:
    result = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_and_stays_silent_as_its_unit_tests_say(promtool: Path) -> None:
    result = subprocess.run(
        [str(promtool), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    alerts = {rule["alert"] for _, rule in load_rules() if "alert" in rule}
    assert alerts - tested == set()


def test_every_alert_says_what_why_where_to_look_and_how_bad() -> None:
    anchors = {
        re.sub(r"[^a-z0-9-]", "", heading.strip().lower().replace(" ", "-"))
        for heading in re.findall(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    }
    alerts = [rule for _, rule in load_rules() if "alert" in rule]
    assert len(alerts) >= 9
    for rule in alerts:
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        assert annotations["description"], rule["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == RUNBOOKS.name, rule["alert"]
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, rule["alert"]


def test_burn_rate_alerts_use_the_workbook_windows_and_factors() -> None:
    rules = {rule.get("alert") or rule.get("record"): rule for _, rule in load_rules()}
    fast = rules["InferfleetErrorBudgetBurnFast"]["expr"]
    slow = rules["InferfleetErrorBudgetBurnSlow"]["expr"]
    for window, factor, expr in (
        ("1h", "14.4", fast), ("5m", "14.4", fast), ("6h", "6", fast), ("30m", "6", fast),
        ("1d", "3", slow), ("2h", "3", slow), ("3d", "1", slow), ("6h", "1", slow),
    ):  # fmt: skip
        assert f"ratio_rate{window} > {factor} * inferfleet:slo_error_budget:ratio" in expr
    assert rules["InferfleetErrorBudgetBurnFast"]["labels"]["severity"] == "page"
    assert rules["InferfleetErrorBudgetBurnSlow"]["labels"]["severity"] == "ticket"


def test_services_without_an_autoscaler_are_judged_against_the_api_default_target() -> None:
    [budget] = [
        r for _, r in load_rules() if r.get("record") == "inferfleet:slo_error_budget:ratio"
    ]
    [default] = re.findall(r"\(1 - ([0-9.]+)\)", budget["expr"])
    assert float(default) == SloSpec.model_fields["attainment_target"].default


# The operator's metrics.


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def labels(**values: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(values.items()))


def test_a_tick_record_becomes_the_operator_series() -> None:
    metrics = OperatorMetrics(clock=lambda: 1000.0)
    metrics.record(tick_record())
    metrics.record(tick_record(at_s=1015.0))
    found = scrape(registry_of(metrics))
    role = labels(namespace="serving", service="chat", deployment="llama", role="aggregated")
    service = labels(namespace="serving", service="chat")
    prefix = "inferfleet_autoscaler_"
    assert found[(prefix + "desired_replicas", role)] == 3
    assert found[(prefix + "current_replicas", role)] == 2
    assert found[(prefix + "min_replicas", role)] == 1
    assert found[(prefix + "max_replicas", role)] == 8
    assert found[(prefix + "gpus_per_replica", role)] == 2
    assert found[(prefix + "gpu_hourly_price_usd", role)] == 2.5
    decided = labels(**dict(role), direction="up", reason="ScaleUpLoad")
    assert found[(prefix + "decisions_total", decided)] == 2  # one per tick
    assert found[(prefix + "metrics_available", service)] == 1
    assert found[(prefix + "newest_sample_age_seconds", service)] == 4.0
    assert found[(prefix + "last_tick_timestamp_seconds", service)] == 1015.0
    assert found[(prefix + "slo_attainment_target", service)] == 0.95


def test_a_hold_without_metrics_counts_as_hold_and_reports_no_sample_age() -> None:
    metrics = OperatorMetrics(clock=lambda: 1000.0)
    [role] = tick_record().roles
    held = RoleRecord(**{**role.__dict__, "desired": 2, "reason": "HoldNoMetrics"})
    metrics.record(tick_record(metrics_available=False, newest_sample_age_s=None, roles=(held,)))
    found = scrape(registry_of(metrics))
    service = labels(namespace="serving", service="chat")
    assert found[("inferfleet_autoscaler_metrics_available", service)] == 0
    assert ("inferfleet_autoscaler_newest_sample_age_seconds", service) not in found
    decided = labels(namespace="serving", service="chat", deployment="llama",
                     role="aggregated", direction="hold", reason="HoldNoMetrics")  # fmt: skip
    assert found[("inferfleet_autoscaler_decisions_total", decided)] == 1


def test_a_service_that_stops_ticking_drops_out() -> None:
    now = [1000.0]
    metrics = OperatorMetrics(expire_after_s=60.0, clock=lambda: now[0])
    metrics.record(tick_record(at_s=1000.0))
    metrics.record(tick_record(at_s=1000.0, service="other"))
    now[0] = 1050.0
    metrics.record(tick_record(at_s=1050.0, service="other"))
    assert any(dict(key[1]).get("service") == "chat" for key in scrape(registry_of(metrics)))
    now[0] = 1070.0  # chat's last tick is 70 s old, other's 20 s
    services = {dict(key[1]).get("service") for key in scrape(registry_of(metrics))}
    assert services == {"other"}


def test_kopf_handler_failures_are_counted_by_kind() -> None:
    metrics = OperatorMetrics()
    logger = logging.getLogger(KOPF_OBJECT_LOGGER)
    counter = ReconcileErrorCounter(metrics)
    logger.addHandler(counter)
    try:
        reference = {"kind": "ModelDeployment", "name": "llama", "namespace": "serving"}
        for _ in range(2):
            logger.error("Handler 'x' failed with an exception.", extra={"k8s_ref": reference})
        logger.warning("not a failure", extra={"k8s_ref": reference})
        logger.error("no object: not a reconcile")
    finally:
        logger.removeHandler(counter)
    found = scrape(registry_of(metrics))
    assert (
        found[("inferfleet_operator_reconcile_errors_total", labels(kind="ModelDeployment"))] == 2
    )
    assert (
        len([key for key in found if key[0] == "inferfleet_operator_reconcile_errors_total"]) == 1
    )


def test_the_operator_exports_its_reconciles_and_its_work_queues() -> None:
    metrics = OperatorMetrics()
    metrics.reconciled("reconcile", "ModelDeployment", 0.02)
    metrics.reconciled("reconcile", "ModelDeployment", 3.0)
    metrics.waited("reconcile", 0.2)
    waiting = [4]
    metrics.watch_queue("reconcile", lambda: waiting[0])
    found = scrape(registry_of(metrics))
    md = labels(queue="reconcile", kind="ModelDeployment")
    assert found[("inferfleet_operator_reconcile_duration_seconds_count", md)] == 2
    assert found[("inferfleet_operator_reconcile_duration_seconds_sum", md)] == 3.02
    fast = labels(queue="reconcile", kind="ModelDeployment", le="0.025")
    assert found[("inferfleet_operator_reconcile_duration_seconds_bucket", fast)] == 1
    queue = labels(queue="reconcile")
    assert found[("inferfleet_operator_queue_wait_seconds_count", queue)] == 1
    assert found[("inferfleet_operator_queue_depth", queue)] == 4
    waiting[0] = 0  # read at each scrape
    assert scrape(registry_of(metrics))[("inferfleet_operator_queue_depth", queue)] == 0


def test_a_controller_times_each_reconcile_and_its_wait_in_the_queue() -> None:
    """Failed or not, every reconcile is timed; the queue reports each key's wait."""
    metrics = OperatorMetrics()
    controller = Controller(
        {}, install=InstallSettings(), autoscaler=AutoscalerSettings(metrics=metrics)
    )
    taken: list[str] = []

    def work(key: str) -> Done:
        taken.append(key)
        if key == "broken":
            raise RuntimeError("refused")
        return Done()

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue(on_wait=functools.partial(metrics.waited, "test"))
        metrics.watch_queue("test", queue.__len__)
        worker = asyncio.create_task(
            controller._work("test", queue, work, lambda _key: "Thing", lambda key: ("T", "", key))
        )
        queue.add("fine")
        queue.add("broken")
        while len(taken) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        worker.cancel()
        await controller.stop()

    asyncio.run(scenario())
    found = scrape(registry_of(metrics))
    thing = labels(queue="test", kind="Thing")
    assert found[("inferfleet_operator_reconcile_duration_seconds_count", thing)] == 2
    assert found[("inferfleet_operator_queue_wait_seconds_count", labels(queue="test"))] == 2
    assert found[("inferfleet_operator_reconcile_errors_total", labels(kind="Thing"))] == 1
    assert found[("inferfleet_operator_queue_depth", labels(queue="test"))] == 0


def test_the_live_tick_records_what_it_decided() -> None:
    metrics = OperatorMetrics(clock=NOW.timestamp)
    settings = AutoscalerSettings(
        prometheus_url=SETTINGS.prometheus_url, window_s=SETTINGS.window_s, metrics=metrics
    )
    source = Scripted(busy(60.0, attainment=0.7, ttft_p95_s=1.2))
    result = tick(inference_service(), {"llama": model_deployment()}, source,
                  settings=settings, now=NOW)  # fmt: skip
    assert result.record is not None
    [role] = result.record.roles
    [decided] = result.deployments
    assert role.desired == decided.decision.replicas[Role.AGGREGATED] > role.current == 2
    assert (role.min_replicas, role.max_replicas) == (1, 20)
    assert role.reason == decided.decision.reason.value
    assert result.record.metrics_available
    assert result.record.newest_sample_age_s == 3.0
    assert result.record.slo_attainment_target == 0.95
    found = scrape(registry_of(metrics))
    key = labels(namespace="serving", service="chat", deployment="llama", role="aggregated")
    assert found[("inferfleet_autoscaler_desired_replicas", key)] == role.desired
    # Prometheus down: the tick holds and says metrics are unavailable.
    tick(inference_service(), {"llama": model_deployment()}, Scripted({}, fail=True),
         settings=settings, now=NOW)  # fmt: skip
    found = scrape(registry_of(metrics))
    assert (
        found[
            ("inferfleet_autoscaler_metrics_available", labels(namespace="serving", service="chat"))
        ]
        == 0
    )


def _operator_lines(url: str) -> Iterator[str]:
    for line in httpx.get(url, timeout=5.0).text.splitlines():
        if line.startswith("inferfleet_"):
            yield line


def test_run_serves_the_metrics_on_its_port_and_port_zero_serves_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = AutoscalerSettings()
    assert serve_metrics(settings, "127.0.0.1", 0) is settings
    port = free_port()
    served = serve_metrics(settings, "127.0.0.1", port)
    assert served.metrics is not None
    served.metrics.record(tick_record(at_s=time.time()))
    lines = list(_operator_lines(f"http://127.0.0.1:{port}/metrics"))
    assert any(line.startswith("inferfleet_autoscaler_desired_replicas{") for line in lines)
    # The port taken: logged, and the operator runs on without metrics.
    with caplog.at_level(logging.ERROR):
        again = serve_metrics(settings, "127.0.0.1", port)
    assert again.metrics is None
    assert "metrics not served" in caplog.text
