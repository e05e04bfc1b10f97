"""The live autoscaling tick with a scripted metrics source: queries filled in, answers read,
decisions handed to the deployments, status and Events as an SRE reads them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from inferfleet.api.catalog import GpuCatalog, GpuType
from inferfleet.api.inference_service import InferenceService
from inferfleet.api.model_deployment import ModelDeployment, Role
from inferfleet.autoscale.controller import (
    AutoscalerSettings,
    MetricsUnavailableError,
    autoscaled_by,
    current_replicas,
    tick,
)
from inferfleet.autoscale.policy import PolicyHistory, Reason, Recommendation, policy_spec
from inferfleet.autoscale.queries import (
    STALENESS,
    DeploymentUsage,
    observe,
    render,
    role_queries,
    service_queries,
    snapshot_from_answers,
)
from inferfleet.autoscale.quota import GpuClaim, GpuQuota
from inferfleet.autoscale.snapshot import RoleMetrics, ServiceMetrics
from inferfleet.planning.memory import weight_bytes_per_gpu
from inferfleet.planning.replica import ReplicaConfig

NOW = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
SETTINGS = AutoscalerSettings(prometheus_url="http://prometheus", window_s=60.0)

SPEC_MD: dict[str, Any] = {
    "model": {"name": "llama-3.1-8b", "source": "hf://meta-llama/Llama-3.1-8B-Instruct"},
    "engine": {"name": "sim"},
    "gpu": {"type": "H100-80GB"},
    "replicas": 2,
}


def model_deployment(status: dict[str, Any] | None = None, **annotations: str) -> ModelDeployment:
    body: dict[str, Any] = {
        "metadata": {"name": "llama", "namespace": "serving", "annotations": annotations},
        "spec": SPEC_MD,
    }
    if status is not None:
        body["status"] = status
    return ModelDeployment.model_validate(body)


def inference_service(
    status: dict[str, Any] | None = None, policy: str = "goodput"
) -> InferenceService:
    body: dict[str, Any] = {
        "metadata": {"name": "chat", "namespace": "serving", "generation": 3},
        "spec": {
            "deployments": [{"name": "llama"}],
            "slo": {"ttftP95Ms": 500, "tpotP95Ms": 50, "attainmentTarget": 0.95},
            "autoscaling": {"policy": policy, "aggregated": {"maxReplicas": 20}},
        },
    }
    if status is not None:
        body["status"] = status
    return InferenceService.model_validate(body)


class Scripted:
    """Answers by field name; records every query it was asked."""

    def __init__(self, answers: Mapping[str, float | None], fail: bool = False) -> None:
        self.values = dict(answers)
        self.fail = fail
        self.asked: list[str] = []
        self.vectors: dict[str, list[tuple[dict[str, str], float]]] = {}

    def answers(self, queries: Mapping[str, str]) -> dict[str, float | None]:
        self.asked.extend(queries.values())
        if self.fail:
            raise MetricsUnavailableError("Prometheus did not answer: connection refused")
        return {name: self.values.get(name) for name in queries}

    def series(self, name: str, query: str) -> list[tuple[dict[str, str], float]]:
        self.asked.append(query)
        if self.fail or name not in self.vectors:
            raise MetricsUnavailableError(f"{name}: no answer")
        return self.vectors[name]


def busy(rate: float, **overrides: float | None) -> dict[str, float | None]:
    """Answers of a service at `rate` requests/s of 1000/200 tokens."""
    answers: dict[str, float | None] = {
        STALENESS: 3.0,
        "requests_per_s": rate,
        "in_flight_requests": rate * 2.0,
        "attainment": 0.99,
        "ttft_p95_s": 0.2,
        "tpot_p95_s": 0.02,
        "mean_prompt_tokens": 1000.0,
        "mean_output_tokens": 200.0,
        "ready_replicas": 2.0,
        "running_requests": rate * 2.0,
        "waiting_requests": 0.0,
        "kv_cache_usage": 0.3,
        "prompt_tokens_per_s": rate * 1000,
        "generation_tokens_per_s": rate * 200,
    }
    return answers | overrides


# Queries.


def test_queries_name_the_service_its_namespace_the_deployment_and_the_window() -> None:
    queries = service_queries("chat", "serving", 60.0)
    assert 'service="chat",namespace="serving"' in queries["attainment"]
    assert "[60s]" in queries["attainment"]
    assert "$" not in "".join(queries.values())
    role = role_queries("serving", "llama-3.v2", Role.DECODE, 30.0)
    # Regex-escaped, then escaped again for the PromQL string: `\-` alone does not parse.
    assert 'inferfleet_io_model_deployment=~"llama\\\\-3\\\\.v2"' in role["running_requests"]
    assert 'inferfleet_io_role="decode"' in role["running_requests"]
    assert "[30s]" in role["prompt_tokens_per_s"]
    assert render('x{a="$S"}', service='we"ird', namespace="n") == 'x{a="we\\"ird"}'


def test_answers_become_a_snapshot_and_nan_becomes_unknown() -> None:
    answers = busy(10.0, attainment=math.nan, ttft_p95_s=math.inf, mean_squared_prompt_tokens=2e6)
    snapshot = snapshot_from_answers(
        answers, {Role.AGGREGATED: answers}, taken_at_s=100.0, window_s=60.0
    )
    assert snapshot is not None
    assert snapshot.newest_sample_age_s == 3.0
    assert snapshot.service.attainment is None  # 0/0: no request completed
    assert snapshot.service.ttft_p95_s is None  # past the last bucket
    assert snapshot.roles[Role.AGGREGATED].ready_replicas == 2
    assert snapshot.roles[Role.AGGREGATED].generation_tokens_per_s == 2000.0
    assert snapshot.service.mean_squared_prompt_tokens == 2e6
    # No router series at all: nothing to judge by.
    assert snapshot_from_answers({}, {}, taken_at_s=1.0, window_s=60.0) is None


def test_observed_performance_from_token_rates_and_the_model() -> None:
    config = ReplicaConfig.from_spec(model_deployment().spec, GpuCatalog.builtin())
    roles = {Role.AGGREGATED: RoleMetrics(Role.AGGREGATED, 2, 40.0, 0.0, 0.3, 20_000.0, 4_000.0)}
    service = ServiceMetrics(20.0, 40.0, attainment=0.9, ttft_p95_s=0.25, tpot_p95_s=0.012)
    observed = observe(service, [DeploymentUsage(config, {Role.AGGREGATED: 2}, roles)])
    assert observed.ttft_p95_ms == pytest.approx(250.0)
    assert observed.goodput_rps == pytest.approx(18.0)
    assert observed.output_tokens_per_second == 4_000.0
    hourly = 2 * config.gpus * config.gpu.hourly_price_usd
    assert observed.cost_per_million_output_tokens_usd == pytest.approx(hourly / 3600 / 4_000 * 1e6)
    flops = 2 * config.model.active_parameters * 24_000
    assert observed.mfu == pytest.approx(flops / (2 * config.gpus * config.linear_flops_rate))
    steps = 4_000.0 / 40.0  # per replica: every step emits one token per running sequence
    read = steps * weight_bytes_per_gpu(config) * config.gpus * 2
    assert observed.mbu == pytest.approx(read / (2 * config.gpus * config.gpu.memory_bandwidth))
    assert observed.mfu is not None
    assert 0 < observed.mfu < 1
    assert observed.mbu is not None
    assert 0 < observed.mbu < 1


# Ticks.


def test_a_load_step_scales_up_and_says_why() -> None:
    md = model_deployment()
    source = Scripted(busy(60.0, attainment=0.7, ttft_p95_s=1.2))
    result = tick(inference_service(), {"llama": md}, source, settings=SETTINGS, now=NOW)
    [decided] = result.deployments
    assert decided.changed
    assert decided.decision.replicas[Role.AGGREGATED] > current_replicas(md)[Role.AGGREGATED]
    status = result.status
    # The decision is the service's data; the deployment's reconcile reads it from there.
    assert status["replicas"] == [
        {
            "deployment": "llama",
            "role": "aggregated",
            "replicas": decided.decision.replicas[Role.AGGREGATED],
        }
    ]
    assert status["lastDecision"]["reason"].startswith("ScaleUp")
    assert "llama" in status["lastDecision"]["message"]
    assert status["observed"]["attainment"] == 0.7
    assert status["observed"]["ttftP95Ms"] == 1200.0
    [metrics] = [c for c in status["conditions"] if c["type"] == "MetricsAvailable"]
    assert metrics["status"] == "True"
    assert "llama" in status["autoscalerState"]
    assert any(reason.startswith("ScaleUp") for reason, _, _ in result.events)
    assert any('service="chat"' in query for query in source.asked)


def test_a_load_step_takes_no_more_gpus_than_the_namespace_quota_leaves() -> None:
    md = model_deployment()  # two 1-GPU replicas, both created
    answers = busy(60.0, attainment=0.7, ttft_p95_s=1.2)
    free = tick(inference_service(), {"llama": md}, Scripted(answers), settings=SETTINGS, now=NOW)
    wanted = free.deployments[0].decision.replicas[Role.AGGREGATED]
    assert wanted >= 3
    # The namespace's other pods leave one GPU fewer than the step wants.
    quota = GpuQuota(left=wanted - 3, pods={"llama": {Role.AGGREGATED: 2}})
    result = tick(
        inference_service(), {"llama": md}, Scripted(answers),
        settings=SETTINGS, now=NOW, gpu_quota=quota,
    )  # fmt: skip
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: wanted - 1}
    assert decided.decision.reason.value == "QuotaExhausted"
    [autoscaling] = [c for c in result.status["conditions"] if c["type"] == "Autoscaling"]
    assert (autoscaling["status"], autoscaling["reason"]) == ("True", "QuotaExhausted")
    assert f"the namespace's GPU quota leaves it {wanted - 1} GPUs" in autoscaling["message"]
    assert [(r, warning) for r, _, warning in result.events if r == "QuotaExhausted"] == [
        ("QuotaExhausted", True)
    ]
    # Said once: the next tick, still short, posts no second Event.
    again = tick(
        inference_service(result.status), {"llama": md}, Scripted(answers),
        settings=SETTINGS, now=NOW + timedelta(seconds=15), gpu_quota=quota,
    )  # fmt: skip
    assert "QuotaExhausted" not in [r for r, _, _ in again.events]


def test_a_deployment_decided_in_a_tick_takes_the_free_gpus_the_next_one_would_see() -> None:
    # Two deployments of one service share what the quota leaves it, one after the other.
    spec = policy_spec(inference_service().spec, model_deployment().spec, GpuCatalog.builtin())
    quota = GpuQuota(left=3, pods={"a": {Role.AGGREGATED: 2}, "b": {Role.AGGREGATED: 1}})
    after_a = quota.after("a", spec, {Role.AGGREGATED: 4})
    assert after_a.left == 1
    assert after_a.limit("b", spec).gpu_quota == 2  # its one pod and the one GPU left
    assert after_a.after("b", spec, {Role.AGGREGATED: 3}).left == 0
    # A scale-down frees nothing until its pods are gone.
    assert quota.after("a", spec, {Role.AGGREGATED: 1}).left == 3


def test_two_deployments_of_a_service_take_no_more_in_one_tick_than_the_quota_leaves() -> None:
    mds = {
        name: ModelDeployment.model_validate(
            {"metadata": {"name": name, "namespace": "serving"}, "spec": SPEC_MD}
        )
        for name in ("a", "b")
    }  # two 1-GPU replicas each, created
    body = inference_service().to_wire()
    body["spec"]["deployments"] = [{"name": "a"}, {"name": "b"}]
    service = InferenceService.model_validate(body)
    answers = busy(60.0, attainment=0.7, ttft_p95_s=1.2)
    free = tick(service, mds, Scripted(answers), settings=SETTINGS, now=NOW)
    assert all(d.decision.replicas[Role.AGGREGATED] >= 3 for d in free.deployments)
    # One GPU is free: the first deployment decided takes it, the second sees none.
    quota = GpuQuota(left=1, pods={name: {Role.AGGREGATED: 2} for name in mds})
    result = tick(service, mds, Scripted(answers), settings=SETTINGS, now=NOW, gpu_quota=quota)
    assert sum(d.decision.replicas[Role.AGGREGATED] for d in result.deployments) == 2 + 2 + 1


def test_a_lower_priority_service_does_not_grow_into_gpus_a_higher_one_waits_for() -> None:
    md = model_deployment()  # two 1-GPU replicas, both created
    answers = busy(60.0, attainment=0.7, ttft_p95_s=1.2)
    waiting = GpuClaim("search", 100_000, True, held=1, wanted=2, at_s=0.0)
    # The one free GPU is held for the interactive service, which waits for it.
    quota = GpuQuota(
        left=0, pods={"llama": {Role.AGGREGATED: 2}}, priority=1000, yields_to=(waiting,)
    )
    result = tick(
        inference_service(), {"llama": md}, Scripted(answers),
        settings=SETTINGS, now=NOW, gpu_quota=quota,
    )  # fmt: skip
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 2}
    assert decided.decision.reason.value == "QuotaExhausted"
    assert (
        "the namespace's GPU quota leaves it 2 GPUs, after search (priority 100000, SLO missed, "
        "waits for 1)"
    ) in decided.decision.message
    # What it claims for the next tick of the others: what it holds, and what it would hold.
    claim = result.gpu_claim
    assert claim is not None
    assert (claim.service, claim.priority, claim.slo_missed, claim.held) == (
        "chat",
        1000,
        True,
        2,
    )
    unquoted = tick(
        inference_service(), {"llama": md}, Scripted(answers), settings=SETTINGS, now=NOW
    ).deployments[0]
    assert claim.wanted == unquoted.decision.replicas[Role.AGGREGATED] > 2
    assert unquoted.decision.unquoted is None
    assert (
        tick(
            inference_service(), {"llama": md}, Scripted(answers), settings=SETTINGS, now=NOW
        ).gpu_claim
        is None
    )


def test_each_tenant_is_charged_its_share_of_the_gpus_by_tokens_served() -> None:
    md = model_deployment()  # two H100 replicas
    body = inference_service().to_wire()
    body["spec"]["tenants"] = [
        {"name": "search", "apiKeySecret": "search-keys"},
        {"name": "etl", "apiKeySecret": "etl-keys", "priority": "batch"},
    ]
    service = InferenceService.model_validate(body)
    source = Scripted(busy(10.0))
    source.vectors["tenant_tokens"] = [
        ({"tenant": "search", "kind": "prompt"}, 3000.0),
        ({"tenant": "search", "kind": "output"}, 1500.0),
        ({"tenant": "etl", "kind": "prompt"}, 1000.0),
        ({"tenant": "etl", "kind": "output"}, 500.0),
    ]
    result = tick(service, {"llama": md}, source, settings=SETTINGS, now=NOW)
    observed = result.status["observed"]
    hourly = observed["costPerHourUsd"]
    assert hourly == pytest.approx(2 * GpuCatalog.builtin()[GpuType.H100_80GB].hourly_price_usd)
    tenants = {t["name"]: t for t in observed["tenants"]}
    # Weighted tokens: search 3000 + 2 x 1500 = 6000, etl 1000 + 2 x 500 = 2000.
    assert tenants["search"]["share"] == 0.75
    assert tenants["etl"]["share"] == 0.25
    assert tenants["search"]["costPerHourUsd"] == pytest.approx(0.75 * hourly, abs=1e-3)
    assert tenants["etl"]["outputTokensPerSecond"] == 500.0
    assert any("sum by (tenant, kind)" in q and 'service="chat"' in q for q in source.asked)
    # Without an answer for the tenants the tick goes on, and the breakdown is left out.
    source.vectors.clear()
    again = tick(service, {"llama": md}, source, settings=SETTINGS, now=NOW)
    assert again.status["observed"]["tenants"] == []
    assert again.status["observed"]["attainment"] is not None


def test_prometheus_down_holds_replicas_and_warns_once() -> None:
    md = model_deployment()
    source = Scripted({}, fail=True)
    first = tick(inference_service(), {"llama": md}, source, settings=SETTINGS, now=NOW)
    [decided] = first.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 2}  # never zero, never moved
    assert not decided.changed
    [metrics] = [c for c in first.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert (metrics["status"], metrics["reason"]) == ("False", "PrometheusUnavailable")
    assert [(reason, warning) for reason, _, warning in first.events] == [
        ("PrometheusUnavailable", True)
    ]
    assert "lastDecision" not in first.status
    # Still down a tick later: no new warning.
    again = tick(
        inference_service(first.status), {"llama": md}, source, settings=SETTINGS,
        now=NOW + timedelta(seconds=15),
    )  # fmt: skip
    assert again.events == []
    # Back: the condition turns True with an Event.
    back = tick(
        inference_service(again.status), {"llama": md}, Scripted(busy(10.0)),
        settings=SETTINGS, now=NOW + timedelta(seconds=30),
    )  # fmt: skip
    [metrics] = [c for c in back.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert metrics["status"] == "True"
    assert ("MetricsAvailable", False) in [(r, w) for r, _, w in back.events]


def test_stale_samples_hold_with_their_own_reason() -> None:
    result = tick(
        inference_service(), {"llama": model_deployment()},
        Scripted(busy(60.0, **{STALENESS: 3600.0})), settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 2}
    [metrics] = [c for c in result.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert metrics["reason"] == "MetricsStale"


def test_no_metrics_source_is_a_condition_not_a_crash() -> None:
    result = tick(
        inference_service(), {"llama": model_deployment()}, None, settings=SETTINGS, now=NOW
    )
    [metrics] = [c for c in result.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert (metrics["status"], metrics["reason"]) == ("False", "NoMetricsSource")


def test_a_pin_wins_over_the_load() -> None:
    pin = '{"replicas": {"aggregated": 3}, "reason": "INC-7", "until": "2026-11-22T04:00:00Z"}'
    md = model_deployment(None, **{"inferfleet.io/pin": pin})
    result = tick(
        inference_service(), {"llama": md}, Scripted(busy(200.0, attainment=0.5)),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [decided] = result.deployments
    assert decided.decision.replicas == {Role.AGGREGATED: 3}
    # Expired: the load decides again.
    later = tick(
        inference_service(), {"llama": md}, Scripted(busy(200.0, attainment=0.5)),
        settings=SETTINGS, now=NOW + timedelta(hours=2),
    )  # fmt: skip
    assert later.deployments[0].decision.replicas[Role.AGGREGATED] > 3


def test_a_held_decision_is_the_one_the_deployment_records() -> None:
    recorded = {
        "autoscaling": {
            "service": "chat",
            "replicas": [{"role": "aggregated", "replicas": 2}],
            "reason": "Steady",
            "time": "2026-11-22T02:00:00Z",
        }
    }
    md = model_deployment(recorded)
    source = Scripted({}, fail=True)  # holds: the same replicas
    result = tick(inference_service(), {"llama": md}, source, settings=SETTINGS, now=NOW)
    assert not result.deployments[0].changed
    assert result.status["replicas"] == [
        {"deployment": "llama", "role": "aggregated", "replicas": 2}
    ]
    assert current_replicas(md) == {Role.AGGREGATED: 2}


def test_history_survives_a_round_trip_through_status() -> None:
    md = model_deployment()
    first = tick(
        inference_service(), {"llama": md}, Scripted(busy(20.0)), settings=SETTINGS, now=NOW
    )
    state = first.status["autoscalerState"]["llama"]
    assert state["demand"], "the tick remembered the demand it saw"
    second = tick(
        inference_service(first.status), {"llama": md}, Scripted(busy(20.0)),
        settings=SETTINGS, now=NOW + timedelta(seconds=15),
    )  # fmt: skip
    assert len(second.status["autoscalerState"]["llama"]["demand"]) > len(state["demand"])
    # Garbage in status is forgotten, not fatal.
    broken = tick(
        inference_service({"autoscalerState": {"llama": {"demand": "nonsense"}}}),
        {"llama": md}, Scripted(busy(20.0)), settings=SETTINGS, now=NOW,
    )  # fmt: skip
    assert broken.deployments


def test_who_autoscales_what() -> None:
    assert autoscaled_by(inference_service(), "llama")
    assert not autoscaled_by(inference_service(), "other")
    assert not autoscaled_by(inference_service(policy="none"), "llama")


def test_a_shared_deployment_is_sized_for_every_service_s_traffic() -> None:
    """Two services route to one deployment; the owner's router sees only its own requests,
    the engines carry both: their queues, KV usage and token rates size the pool."""
    md = model_deployment()
    own_router_only = busy(1.0)
    engines_carry_both = busy(
        1.0,
        running_requests=60.0,
        waiting_requests=40.0,
        kv_cache_usage=0.97,
        prompt_tokens_per_s=40_000.0,
        generation_tokens_per_s=8_000.0,
    )
    alone = tick(
        inference_service(), {"llama": md}, Scripted(own_router_only), settings=SETTINGS, now=NOW
    )
    shared = tick(
        inference_service(), {"llama": md}, Scripted(engines_carry_both),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [held], [grown] = alone.deployments, shared.deployments
    assert grown.decision.replicas[Role.AGGREGATED] > held.decision.replicas[Role.AGGREGATED]


def test_the_cold_starts_measured_and_planned_with_are_in_status() -> None:
    md = model_deployment()
    first = tick(
        inference_service(), {"llama": md}, Scripted(busy(60.0, attainment=0.7)),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [decided] = first.deployments
    grown = decided.decision.replicas[Role.AGGREGATED]
    assert grown > 2
    # Ordered while both replicas served: awaited, nothing measured yet. The service configures
    # no cold start: planned as estimated for the deployment (the emulator, 1 s: no weights).
    assert first.status["coldStarts"] == [
        {"deployment": "llama", "role": "aggregated", "measuredSeconds": [], "plannedSeconds": 1.0}
    ]
    # The next tick, 200 s later, sees one more serving: it came up within those 200 s, so
    # half of them are taken off, and 100 s, far from the 1 s estimated, is planned with.
    recorded = {
        "autoscaling": {
            "service": "chat",
            "replicas": [{"role": "aggregated", "replicas": grown}],
            "reason": decided.decision.reason.value,
            "time": NOW.isoformat(),
        }
    }
    later = tick(
        inference_service(first.status), {"llama": model_deployment(recorded)},
        Scripted(busy(60.0, ready_replicas=3.0)),
        settings=SETTINGS, now=NOW + timedelta(seconds=200),
    )  # fmt: skip
    [cold_starts] = later.status["coldStarts"]
    assert cold_starts["measuredSeconds"] == [100.0]
    assert cold_starts["plannedSeconds"] == 100.0


def test_a_service_at_zero_wakes_on_the_requests_its_router_pushed_before_a_scrape() -> None:
    """Prometheus has not scraped the held requests yet: the count the router pushed wakes
    the service in this tick; without it, the service stays at zero."""
    body = inference_service().to_wire()
    body["spec"]["autoscaling"]["aggregated"] = {"minReplicas": 0, "maxReplicas": 20}
    body["status"] = {"replicas": [{"deployment": "llama", "role": "aggregated", "replicas": 0}]}
    service = InferenceService.model_validate(body)
    idle = Scripted(busy(0.0, in_flight_requests=0.0, attainment=None, ready_replicas=0.0))
    md = model_deployment()
    asleep = tick(service, {"llama": md}, idle, settings=SETTINGS, now=NOW)
    [held] = asleep.deployments
    assert held.decision.replicas == {Role.AGGREGATED: 0}
    assert held.decision.reason is Reason.IDLE_AT_ZERO

    woken = tick(service, {"llama": md}, idle, settings=SETTINGS, now=NOW, waiting=3)
    [decided] = woken.deployments
    assert decided.decision.reason is Reason.WAKE_FROM_ZERO
    assert decided.decision.replicas[Role.AGGREGATED] >= 1
    assert woken.status["replicas"][0]["replicas"] >= 1


def test_without_prometheus_a_push_wakes_a_service_at_zero_and_moves_nothing_else() -> None:
    body = inference_service().to_wire()
    body["spec"]["autoscaling"]["aggregated"] = {"minReplicas": 0, "maxReplicas": 20}
    body["status"] = {"replicas": [{"deployment": "llama", "role": "aggregated", "replicas": 0}]}
    asleep = InferenceService.model_validate(body)
    away = Scripted({}, fail=True)
    md = model_deployment()
    woken = tick(asleep, {"llama": md}, away, settings=SETTINGS, now=NOW, waiting=2)
    [decided] = woken.deployments
    assert decided.decision.reason is Reason.WAKE_FROM_ZERO
    assert decided.decision.replicas[Role.AGGREGATED] >= 1
    [metrics] = [c for c in woken.status["conditions"] if c["type"] == "MetricsAvailable"]
    assert metrics["status"] == "False"
    # Replicas that run (all unhealthy, say) hold for want of metrics, whatever the push says.
    body["status"]["replicas"][0]["replicas"] = 2
    running = InferenceService.model_validate(body)
    held = tick(running, {"llama": md}, away, settings=SETTINGS, now=NOW, waiting=2)
    [kept] = held.deployments
    assert kept.decision.reason is Reason.NO_METRICS
    assert kept.decision.replicas == {Role.AGGREGATED: 2}


def test_a_wake_slower_than_the_wake_timeout_is_a_condition_and_an_event() -> None:
    """An 8B model from the hub starts in about 294 s (estimated: the service configures no
    cold start); a router that holds requests 120 s would fail every request that wakes it."""
    body = inference_service().to_wire()
    body["spec"]["autoscaling"]["aggregated"] = {"minReplicas": 0, "maxReplicas": 20}
    body["spec"]["autoscaling"]["wakeTimeoutSeconds"] = 120
    service = InferenceService.model_validate(body)
    vllm = ModelDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "serving"},
         "spec": {**SPEC_MD, "engine": {"name": "vllm"}}}
    )  # fmt: skip
    result = tick(service, {"llama": vllm}, Scripted(busy(1.0)), settings=SETTINGS, now=NOW)
    [autoscaling] = [c for c in result.status["conditions"] if c["type"] == "Autoscaling"]
    assert autoscaling["status"] == "True"
    assert autoscaling["reason"] == "WakeSlowerThanTimeout"
    assert "llama starts in 294 s, the router holds requests 120 s" in autoscaling["message"]
    assert [e[0] for e in result.events].count("WakeSlowerThanTimeout") == 1
    # Said once: the next tick finds the condition already there.
    again = tick(
        InferenceService.model_validate({**body, "status": result.status}), {"llama": vllm},
        Scripted(busy(1.0)), settings=SETTINGS, now=NOW + timedelta(seconds=30),
    )  # fmt: skip
    assert "WakeSlowerThanTimeout" not in [e[0] for e in again.events]
    # A weight cache makes the wake fit: about 232 s, and the router holds requests 300 s.
    body["spec"]["autoscaling"]["wakeTimeoutSeconds"] = 300
    cached = ModelDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "serving"},
         "spec": {**SPEC_MD, "engine": {"name": "vllm"},
                  "model": {"name": "llama-3.1-8b", "source": "pvc://weights/llama"}}}
    )  # fmt: skip
    fits = tick(
        InferenceService.model_validate(body), {"llama": cached}, Scripted(busy(1.0)),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [autoscaling] = [c for c in fits.status["conditions"] if c["type"] == "Autoscaling"]
    assert autoscaling["reason"] == "Autoscaling"


def test_the_running_fleet_s_advice_is_in_status_and_an_event_once() -> None:
    """Prompts that repeat a recent prompt's prefix, to a deployment with prefix caching off:
    the tick advises turning it on, with the inputs it read; said once as an Event; held
    through a tick without metrics; gone once the prompts stop repeating."""
    md = ModelDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "serving"},
         "spec": {**SPEC_MD, "prefixCaching": False}}
    )  # fmt: skip
    shared = busy(4.0, prefix_blocks_per_s=40.0, prefix_blocks_seen_per_s=30.0)
    first = tick(inference_service(), {"llama": md}, Scripted(shared), settings=SETTINGS, now=NOW)
    [advice] = [a for a in first.status["advice"] if a["reason"] == "EnablePrefixCaching"]
    assert advice["deployment"] == "llama"
    assert advice["reason"] == "EnablePrefixCaching"
    assert advice["inputs"]["repeatedPrefixShare"] == 0.75
    assert "prefix caching is off" in advice["message"]
    assert [e for e in first.events if e[0] == "EnablePrefixCaching"] == [
        ("EnablePrefixCaching", f"llama: {advice['message']}", False)
    ]
    InferenceService.model_validate(inference_service().to_wire() | {"status": first.status})
    advised = inference_service(first.status)
    again = tick(advised, {"llama": md}, Scripted(shared), settings=SETTINGS, now=NOW)
    assert again.status["advice"] == first.status["advice"]
    assert not [e for e in again.events if e[0] == "EnablePrefixCaching"]
    away = tick(advised, {"llama": md}, Scripted({}, fail=True), settings=SETTINGS, now=NOW)
    assert "advice" not in away.status  # a merge patch: what was advised stands
    distinct = busy(4.0, prefix_blocks_per_s=40.0, prefix_blocks_seen_per_s=2.0)
    later = tick(advised, {"llama": md}, Scripted(distinct), settings=SETTINGS, now=NOW)
    assert "EnablePrefixCaching" not in [a["reason"] for a in later.status["advice"]]


def test_each_pool_s_diagnosis_is_in_status_with_the_engines_queueing() -> None:
    """The tick reads the engines' queue and prefill quantiles beside their token rates and
    writes one diagnosis per deployment and role, as the status schema has it; a NaN
    quantile (nothing admitted in the window) is no claim; a tick without metrics leaves the
    diagnosis as it was."""
    md = ModelDeployment.model_validate(
        {"metadata": {"name": "llama", "namespace": "serving"}, "spec": SPEC_MD}
    )
    queued = busy(4.0, queue_p95_s=0.9, prefill_p95_s=0.15)
    first = tick(inference_service(), {"llama": md}, Scripted(queued), settings=SETTINGS, now=NOW)
    [found] = first.status["diagnosis"]
    assert (found["deployment"], found["role"]) == ("llama", "aggregated")
    assert found["bound"] in {"compute", "bandwidth", "light"}
    assert found["message"].startswith("aggregated: ")
    assert "900 ms queued, 150 ms prefilling: queueing dominates" in found["message"]
    assert found["inputs"]["queueP95Ms"] == 900
    assert found["inputs"]["runningPerReplica"] == 4  # 8 running over 2 ready replicas
    InferenceService.model_validate(inference_service().to_wire() | {"status": first.status})
    undefined = tick(
        inference_service(), {"llama": md}, Scripted(busy(4.0, queue_p95_s=math.nan)),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    [unclaimed] = undefined.status["diagnosis"]
    assert "queueP95Ms" not in unclaimed["inputs"]
    away = tick(
        inference_service(first.status), {"llama": md}, Scripted({}, fail=True),
        settings=SETTINGS, now=NOW,
    )  # fmt: skip
    assert "diagnosis" not in away.status


def test_a_scale_in_sets_the_deletion_cost_of_each_pod_of_the_role_it_shrinks() -> None:
    """The pods holding the fewest requests go first: their cost is what they hold."""
    md = model_deployment()
    quiet = Scripted(busy(0.1, ready_replicas=4.0))
    quiet.vectors["pod_in_flight"] = [
        ({"pod": "llama-aggregated-a"}, 3.0),
        ({"pod": "llama-aggregated-b"}, 0.0),
        ({}, 9.0),  # no pod label: nothing to annotate
    ]
    # Four replicas for a trickle, and a stabilisation window that has long said fewer.
    body = inference_service().to_wire()
    body["status"] = {
        "replicas": [{"deployment": "llama", "role": "aggregated", "replicas": 4}],
        "autoscalerState": {
            "llama": PolicyHistory(
                recommendations=(Recommendation(NOW.timestamp() - 900, {Role.AGGREGATED: 1}),)
            ).to_wire()
        },
    }
    service = InferenceService.model_validate(body)
    result = tick(service, {"llama": md}, quiet, settings=SETTINGS, now=NOW)
    [decided] = result.deployments
    assert decided.decision.replicas[Role.AGGREGATED] < 4, decided.decision.message
    assert result.deletion_costs == {"llama-aggregated-a": 3, "llama-aggregated-b": 0}
    assert any(q.startswith("sum by (pod)") for q in quiet.asked)
    # A tick that does not shrink asks nothing per pod and sets no cost.
    loaded = Scripted(busy(60.0, attainment=0.7, ttft_p95_s=1.2))
    grown = tick(inference_service(), {"llama": md}, loaded, settings=SETTINGS, now=NOW)
    assert grown.deletion_costs == {}
    assert not any(q.startswith("sum by (pod)") for q in loaded.asked)
