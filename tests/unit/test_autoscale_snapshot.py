"""What the autoscaler reads from Prometheus: every malformed answer holds the tick with a
reason that says what was wrong (served by a real HTTP server on loopback, read through the
real client), and the engine queries select exactly the pod label the renderer writes."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.autoscale.controller import (
    MALFORMED_ANSWER,
    QUERY_FAILED,
    AutoscalerSettings,
    PrometheusSource,
    tick,
)
from inferfleet.autoscale.queries import (
    MalformedAnswerError,
    instant_value,
    role_queries,
    service_queries,
)
from inferfleet.render import render_model_deployment
from inferfleet.render.common import LABEL_MODEL_DEPLOYMENT
from tests.unit.golden.specs import disaggregated_spec
from tests.unit.golden.specs import model_deployment as rendered_deployment
from tests.unit.test_autoscale_controller import inference_service, model_deployment

NOW = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
Answer = tuple[int, bytes]


def vector(*values: str) -> dict[str, Any]:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1.0, v]} for i, v in enumerate(values)]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def body(payload: object) -> bytes:
    return json.dumps(payload).encode()


HEALTHY: Answer = (200, body(vector("1")))


class FakePrometheus:
    """`/api/v1/query` on 127.0.0.1, answering each query with `answer(query)`."""

    def __init__(self) -> None:
        self.answer: Callable[[str], Answer] = lambda _query: HEALTHY
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                status, content = fake.answer(query)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    thread = threading.Thread(target=fake.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    thread.join()


def run_tick(prometheus: FakePrometheus) -> tuple[Any, dict[str, Any]]:
    settings = AutoscalerSettings(prometheus_url=prometheus.url)
    result = tick(
        inference_service(), {"llama": model_deployment()},
        PrometheusSource(prometheus.url, budget_s=5.0), settings=settings, now=NOW,
    )  # fmt: skip
    [metrics] = [c for c in result.status["conditions"] if c["type"] == "MetricsAvailable"]
    return result, metrics


MALFORMED: list[tuple[str, Answer, str, str]] = [
    # (case, answer to every query, MetricsAvailable reason, what the message says)
    (
        "status error with HTTP 200",
        (200, body({"status": "error", "errorType": "bad_data", "error": "parse error"})),
        MALFORMED_ANSWER,
        "answered without a query result (KeyError: 'data')",
    ),
    (
        "status error with HTTP 400",
        (400, body({"status": "error", "errorType": "bad_data", "error": "parse error at 1"})),
        QUERY_FAILED,
        "parse error at 1",
    ),
    (
        "status error with HTTP 503",
        (503, body({"status": "error", "errorType": "unavailable", "error": "too many queries"})),
        QUERY_FAILED,
        "too many queries",
    ),
    ("value not a number", (200, body(vector("abc"))), MALFORMED_ANSWER, "'abc' is not a number"),
    (
        "NaN where a number is needed",
        (200, body(vector("NaN"))),
        MALFORMED_ANSWER,
        "requests_per_s: value 'NaN' where a finite number is needed",
    ),
    (
        "+Inf where a number is needed",
        (200, body(vector("+Inf"))),
        MALFORMED_ANSWER,
        "value '+Inf' where a finite number is needed",
    ),
    (
        "matrix where a vector is expected",
        (
            200,
            body(
                {
                    "status": "success",
                    "data": {
                        "resultType": "matrix",
                        "result": [{"metric": {}, "values": [[1.0, "1"], [2.0, "2"]]}],
                    },
                }
            ),
        ),
        MALFORMED_ANSWER,
        "not an instant vector (0.value: Field required)",
    ),
    (
        "scalar where a vector is expected",
        (200, body({"status": "success", "data": {"resultType": "scalar", "result": [1, "3"]}})),
        MALFORMED_ANSWER,
        "not an instant vector",
    ),
    (
        "data without result",
        (200, body({"status": "success", "data": {}})),
        MALFORMED_ANSWER,
        "KeyError: 'result'",
    ),
    (
        "series without metric",
        (200, body({"status": "success", "data": {"result": [{"value": [1.0, "1"]}]}})),
        MALFORMED_ANSWER,
        "0.metric: Field required",
    ),
    (
        "value not a pair",
        (200, body({"status": "success", "data": {"result": [{"metric": {}, "value": "1"}]}})),
        MALFORMED_ANSWER,
        "not an instant vector (0.value",
    ),
    (
        "two series where one is expected",
        (200, body(vector("1", "2"))),
        MALFORMED_ANSWER,
        "2 series where one was expected",
    ),
    ("not JSON", (200, b"<html>502 Bad Gateway</html>"), MALFORMED_ANSWER, "JSONDecodeError"),
    ("JSON but not an object", (200, b"[1, 2]"), MALFORMED_ANSWER, "TypeError"),
    ("JSON null", (200, b"null"), MALFORMED_ANSWER, "TypeError"),
]


@pytest.mark.parametrize(
    ("answer", "reason", "says"), [case[1:] for case in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_a_malformed_answer_holds_and_says_why(
    prometheus: FakePrometheus, answer: Answer, reason: str, says: str
) -> None:
    prometheus.answer = lambda _query: answer
    result, metrics = run_tick(prometheus)
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 2}  # held: never zero, never moved
    assert not decided.changed
    # The held replicas are the service's decision, which its deployment's reconcile applies.
    assert result.status["replicas"] == [
        {"deployment": "llama", "role": "aggregated", "replicas": 2}
    ]
    assert (metrics["status"], metrics["reason"]) == ("False", reason)
    assert says in metrics["message"]
    assert [(r, w) for r, _, w in result.events] == [(reason, True)]
    assert says in result.events[0][1]
    assert "lastDecision" not in result.status
    assert result.record is not None
    assert not result.record.metrics_available


def test_a_malformed_engine_answer_holds_too(prometheus: FakePrometheus) -> None:
    """The router's answers are fine; one engine query's count is NaN."""
    prometheus.answer = lambda query: (
        (200, body(vector("NaN"))) if query.startswith("count(vllm:") else HEALTHY
    )
    result, metrics = run_tick(prometheus)
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 2}
    assert (metrics["status"], metrics["reason"]) == ("False", MALFORMED_ANSWER)
    assert "ready_replicas: value 'NaN'" in metrics["message"]
    assert "count(vllm:num_requests_running" in metrics["message"]  # the query, for the SRE


def test_undefined_ratios_and_quantiles_are_not_malformed(prometheus: FakePrometheus) -> None:
    """0/0 (no request completed) is NaN, a quantile past the last bucket +Inf: both normal."""

    def answer(query: str) -> Answer:
        if " / " in query:  # attainment, mean prompt and output lengths
            return 200, body(vector("NaN"))
        if query.startswith("histogram_quantile"):
            return 200, body(vector("+Inf"))
        return HEALTHY

    prometheus.answer = answer
    _result, metrics = run_tick(prometheus)
    assert (metrics["status"], metrics["reason"]) == ("True", "MetricsFresh")


def test_prometheus_down_is_unavailable_not_malformed() -> None:
    source = PrometheusSource("http://127.0.0.1:9", budget_s=2.0)  # discard port: refused
    result = tick(
        inference_service(), {"llama": model_deployment()}, source,
        settings=AutoscalerSettings(prometheus_url="http://127.0.0.1:9"), now=NOW,
    )  # fmt: skip
    [metrics] = [c for c in result.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnavailable")


@pytest.mark.parametrize(
    ("result", "value"),
    [([], None), (vector("2.5")["data"]["result"], 2.5), (vector("0")["data"]["result"], 0.0)],
)
def test_instant_value_of_a_well_formed_vector(result: object, value: float | None) -> None:
    assert instant_value("running_requests", result) == value


def test_instant_value_refuses_what_is_not_one_number() -> None:
    with pytest.raises(MalformedAnswerError, match="kv_cache_usage: value '-Inf'"):
        instant_value("kv_cache_usage", vector("-Inf")["data"]["result"])
    with pytest.raises(MalformedAnswerError, match="not an instant vector"):
        instant_value("kv_cache_usage", {"resultType": "vector"})


# Long names: the queries select the label the renderer puts on the pods.

LONG_NAME = "llama-3.1-70b-instruct-canary-eu-west-1-tenant-acme-production-v2.7-ab"
PROMQL_DEPLOYMENT = re.compile(r'inferfleet_io_model_deployment=~"((?:[^"\\]|\\.)*)"')


def deployment_matcher(query: str) -> str:
    """The regex of the query's model-deployment matcher, its PromQL string escapes undone."""
    match = PROMQL_DEPLOYMENT.search(query)
    assert match is not None, query
    return re.sub(r"\\(.)", r"\1", match.group(1))


def test_queries_of_a_long_name_match_the_rendered_pods() -> None:
    assert len(LONG_NAME) == 70
    md: ModelDeployment = rendered_deployment(disaggregated_spec(), name=LONG_NAME)
    engines = [o for o in render_model_deployment(md) if o["kind"] == "Deployment"]
    assert {e["spec"]["template"]["metadata"]["labels"]["inferfleet.io/role"] for e in engines} == {
        "prefill",
        "decode",
    }
    for engine in engines:
        labels = engine["spec"]["template"]["metadata"]["labels"]
        pod_label = labels[LABEL_MODEL_DEPLOYMENT]
        assert pod_label != LONG_NAME  # hashed: a label value holds 63 characters at most
        assert len(pod_label) <= 63
        role = Role(labels["inferfleet.io/role"])
        for query in role_queries("serving", LONG_NAME, role, 60.0).values():
            if "inferfleet_router_" in query:  # routers label series with the name as it is
                assert f'deployment="{LONG_NAME}",role="{role.value}"' in query
                continue
            matcher = deployment_matcher(query)
            assert matcher == re.escape(pod_label)  # the label, every regex character escaped
            assert re.fullmatch(matcher, pod_label)
            assert not re.fullmatch(matcher, LONG_NAME)
            assert f'inferfleet_io_role="{role.value}"' in query


def test_a_short_name_is_matched_as_itself() -> None:
    md = rendered_deployment(disaggregated_spec(), name="llama-3.v2")
    [engine, *_] = [o for o in render_model_deployment(md) if o["kind"] == "Deployment"]
    assert engine["spec"]["template"]["metadata"]["labels"][LABEL_MODEL_DEPLOYMENT] == "llama-3.v2"
    matcher = deployment_matcher(
        role_queries("serving", "llama-3.v2", Role.DECODE, 60.0)["running_requests"]
    )
    assert re.fullmatch(matcher, "llama-3.v2")
    assert not re.fullmatch(matcher, "llama-3xv2")  # the dot is escaped, not any character


def test_the_recent_arrival_rate_is_read_over_its_own_window() -> None:
    queries = service_queries("chat", "serving", 60.0, 30.0)
    assert queries["recent_arrivals_per_s"].endswith("[30s]))")
    assert queries["arrivals_per_s"].endswith("[60s]))")
    # Without a short window, the recent rate is the rate window's.
    assert service_queries("chat", "serving", 60.0)["recent_arrivals_per_s"].endswith("[60s]))")
