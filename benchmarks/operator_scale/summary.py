"""A run's measurements -> the figures (one JSON-able dict), and the operator's scale goals judged
against them (`goals`, pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from benchmarks.operator_scale.audit import (
    LATENCY_STEPS,
    Phase,
    api_summary,
    missing_latencies,
    operator_latencies,
    read_audit,
    stages,
    writers,
    writes_per_service,
)
from benchmarks.operator_scale.harness import (
    BARE_DEPLOYMENTS,
    BARE_NAMESPACE,
    BARE_RENDERED,
    BARE_RENDERED_NAMESPACE,
    FLEET_NAMESPACE,
    BareRun,
    Run,
    service_names,
)
from benchmarks.operator_scale.operator_log import scan_operator_log
from benchmarks.operator_scale.procfs import cpu_between
from benchmarks.operator_scale.stats import distribution, iso, percentile
from benchmarks.operator_scale.workloads import (
    children,
    inference_service,
    model_deployment,
)
from inferfleet import __version__
from inferfleet.render.inference_service import router_name

PODS_PER_NODE = 110  # inferfleet.devcluster.nodes gives every fake node 110 pods


def _goal(
    figure: str, value: float | None, limit: float, *, inclusive: bool, unit: str
) -> dict[str, Any]:
    met = None if value is None else value <= limit if inclusive else value < limit
    relation = ("=" if limit == 0 else "<=") if inclusive else "<"
    return {
        "figure": figure,
        "value": value,
        "goal": f"{relation} {limit:g}{(' ' + unit) if unit else ''}",
        "met": met,
    }


def goals(headline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The operator's scale goals, each with the figure it judges and whether it was met (None: the
    figure was not measured)."""
    latency = headline.get("operator_latency_s") or {}
    rows = [
        _goal(
            f"operator latency p99, {step}",
            (latency.get(step) or {}).get("p99"),
            2.0,
            inclusive=False,
            unit="s",
        )
        for step in LATENCY_STEPS
    ]
    rows += [
        _goal(
            "time to all Ready / bare Deployments' time to all rolled out",
            headline.get("all_ready_x_bare"),
            1.3,
            inclusive=True,
            unit="x",
        ),
        _goal(
            "operator writes per reconciled resource on create",
            headline.get("operator_writes_per_resource_rollout"),
            3,
            inclusive=True,
            unit="",
        ),
        _goal(
            "operator CPU per reconcile",
            headline.get("operator_cpu_ms_per_reconcile"),
            20,
            inclusive=False,
            unit="ms",
        ),
        _goal(
            "operator peak RSS",
            headline.get("operator_peak_rss_mib"),
            300,
            inclusive=False,
            unit="MiB",
        ),
        _goal(
            "operator writes in the idle minute",
            headline.get("operator_writes_steady_minute"),
            0,
            inclusive=True,
            unit="",
        ),
    ]
    return rows


def _bare(bare: BareRun, run: Run, requests: Any, phase: Phase) -> dict[str, Any]:
    after = [at - bare.apply_start for at in bare.rolled_out.values()]
    figures = distribution(after) or {}
    return {
        "deployments": bare.deployments,
        "objects": bare.objects,
        "complete": bare.complete,
        "rolled_out": len(bare.rolled_out),
        "apply_s": round(bare.apply_end - bare.apply_start, 3),
        "all_rolled_out_s": round(max(after), 3) if after and bare.complete else None,
        "rolled_out_s": figures or None,
        "deleted_s": round(bare.deleted_s, 2),
        "cpu": cpu_between(run.cpu[f"{phase.name} start"], run.cpu[f"{phase.name} rolled out"]),
        "writes_by_user": writers(requests, phase),
        "watch": bare.watch,
    }


def _latencies(run: Run, requests: Any) -> dict[str, Any]:
    names = service_names(run.config.services)
    samples = operator_latencies(
        requests,
        namespace=FLEET_NAMESPACE,
        children={name: children(name, FLEET_NAMESPACE) for name in names},
        backends={
            name: [
                d["name"] for d in inference_service(name, FLEET_NAMESPACE)["spec"]["deployments"]
            ]
            for name in names
        },
        routers={name: router_name(name) for name in names},
    )
    return {
        "steps": {step: distribution(list(samples[step].values())) for step in LATENCY_STEPS},
        "missing": missing_latencies(samples, len(names), len(names)),
    }


def summarise(run: Run) -> dict[str, Any]:
    requests, audit_files = read_audit(run.state_dir / "cluster" / "logs")
    phases = {phase.name: phase for phase in run.phases}
    services = run.config.services
    singles = [ready - start for start, ready, _ in run.baseline]
    single = percentile(singles, 50)
    per_service = [ready - run.apply_start for ready in run.rollout_ready.values()]
    per_service_operator_clock = [t - run.apply_start for t in run.rollout_transition.values()]
    all_ready = max(per_service) if per_service and run.complete else None
    rollout = distribution(per_service) or {}
    bare = _bare(run.bare, run, requests, phases[BARE_DEPLOYMENTS])
    bare_rendered = (
        _bare(run.bare_rendered, run, requests, phases[BARE_RENDERED])
        if BARE_RENDERED in phases
        else None
    )
    rendered_s = bare_rendered["all_rolled_out_s"] if bare_rendered else None
    latencies = _latencies(run, requests)

    def ratio(value: float | None, to: float | None, digits: int = 1) -> float | None:
        return round(value / to, digits) if value is not None and to else None

    def operator_cpu(first: str, last: str) -> float:
        return run.cpu[last].processes["operator"] - run.cpu[first].processes["operator"]

    first_count, last_count = (run.reconciles.get(m) for m in ("rollout start", "steady start"))
    # Reconciles run in the rollout, as the operator's own metrics count them (None: unread).
    reconcile_runs = (
        last_count - first_count if first_count is not None and last_count is not None else None
    )
    baseline_api = [api_summary(requests, p) for p in run.phases if p.name.startswith("baseline")]
    rollout_api = api_summary(requests, phases["rollout"])
    steady_api = api_summary(requests, phases["steady"])
    headline: dict[str, Any] = {
        "complete": run.complete,
        "services_ready": len(run.rollout_ready),
        "single_service_ready_s": round(single, 3),
        "apply_s": round(run.apply_end - run.apply_start, 3),
        "all_ready_s": round(all_ready, 3) if all_ready is not None else None,
        "p50_ready_s": rollout.get("p50"),
        "p99_ready_s": rollout.get("p99"),
        "all_ready_x_single": ratio(all_ready, single),
        "p50_x_single": ratio(rollout.get("p50"), single),
        "p99_x_single": ratio(rollout.get("p99"), single),
        "bare_all_rolled_out_s": bare["all_rolled_out_s"],
        "all_ready_x_bare": ratio(all_ready, bare["all_rolled_out_s"], 2),
        "bare_rendered_all_rolled_out_s": rendered_s,
        "all_ready_x_bare_rendered": ratio(all_ready, rendered_s, 2),
        "operator_quiet_after_all_ready_s": round(run.quiet_after_s, 1)
        if run.quiet_after_s is not None
        else None,
        "operator_latency_s": {
            step: {"p50": dist["p50"], "p99": dist["p99"]} if dist else None
            for step, dist in latencies["steps"].items()
        },
        "operator_peak_rss_mib": round(run.operator_peak_rss_kib / 1024, 1),
        "operator_cpu_s_total": round(run.operator_cpu_s, 2),
        "operator_cpu_s_rollout": round(operator_cpu("rollout start", "all ready"), 2),
        "operator_cpu_s_rollout_until_quiet": round(
            operator_cpu("rollout start", "steady start"), 2
        ),
        # Everything the rollout cost it, the work left queued at all Ready included.
        "operator_cpu_ms_per_reconcile": round(
            1000 * operator_cpu("rollout start", "steady start") / (2 * services), 2
        ),
        "operator_reconciles_per_resource": round(reconcile_runs / (2 * services), 2)
        if reconcile_runs
        else None,
        "operator_cpu_ms_per_reconcile_run": round(
            1000 * operator_cpu("rollout start", "steady start") / reconcile_runs, 2
        )
        if reconcile_runs
        else None,
        "operator_cpu_s_per_service_single": round(
            operator_cpu("baseline start", "rollout start") / max(1, len(run.baseline)), 3
        ),
        "operator_cpu_s_per_service_rollout": round(
            operator_cpu("rollout start", "all ready") / services, 3
        ),
        "operator_writes_per_resource_rollout": rollout_api.get("writes_per_resource"),
        "operator_reads_per_resource_rollout": rollout_api.get("reads_per_resource"),
        "operator_writes_per_resource_single": baseline_api[0].get("writes_per_resource")
        if baseline_api
        else None,
        "operator_reads_per_resource_single": baseline_api[0].get("reads_per_resource")
        if baseline_api
        else None,
        "operator_writes_steady_minute": steady_api["writes"],
        "operator_reads_steady_minute": steady_api["reads"],
    }
    return {
        "benchmark": "operator_scale",
        "run_at": iso(run.operator_start),
        "hardware": run.hardware,
        "software": _software(run),
        "config": {
            "services": services,
            "objects_applied": 2 * services,
            "node_pools": run.config.nodes,
            "cpu_nodes": run.config.cpu_nodes,
            "pods_per_node": PODS_PER_NODE,
            "controller_manager_and_scheduler_client": {
                "kube_api_qps": run.config.client_rate.qps,
                "kube_api_burst": run.config.client_rate.burst,
            },
            "model_deployment": model_deployment("<name>", FLEET_NAMESPACE)["spec"],
            "inference_service": inference_service("<name>", FLEET_NAMESPACE)["spec"],
            "bare_namespace": BARE_NAMESPACE,
            "bare_rendered_namespace": BARE_RENDERED_NAMESPACE,
            "baseline_samples": run.config.baseline_samples,
            "settle_s": run.config.settle_s,
            "quiet_timeout_s": run.config.quiet_timeout_s,
            "steady_s": run.config.steady_s,
        },
        "headline": headline,
        "goals": goals(headline),
        "bare_deployments": bare,
        "bare_rendered": bare_rendered,
        "operator_latency_s": latencies,
        "startup": {
            "cluster_up_s": round(run.cluster_up_s, 2),
            "operator_start_to_first_service_ready_s": round(run.warmup_ready_s, 2),
        },
        "baseline": {
            "ready_s": [round(s, 3) for s in singles],
            "ready_s_operator_clock": [
                round(t - start, 3) for start, _, t in run.baseline if t is not None
            ],
            "api": baseline_api,
        },
        "rollout": {
            "ready_s": rollout,
            "ready_s_operator_clock": distribution(per_service_operator_clock),
            "stages_s": stages(
                requests,
                namespace=FLEET_NAMESPACE,
                objects=run.fleet,
                isvc_ready=run.rollout_transition,
                isvc_seen=run.rollout_ready,
                start=run.apply_start,
            )
            if run.fleet
            else None,
            "operator_writes_per_service": writes_per_service(
                requests, FLEET_NAMESPACE, phases["rollout"]
            ),
            "pods_at_the_end": {
                "by_phase": run.fleet.pods_by_phase,
                "unschedulable": run.fleet.unscheduled_pods,
                "unschedulable_example": run.fleet.unscheduled_example,
            }
            if run.fleet
            else None,
            "api": rollout_api,
            "writes_by_user": writers(requests, phases["rollout"]),
            "cpu": cpu_between(run.cpu["rollout start"], run.cpu["all ready"]),
            "cores_used_per_10s": run.timeline,
        },
        "steady": {
            "api": steady_api,
            "writes_by_user": writers(requests, phases["steady"]),
            "cpu": cpu_between(run.cpu["steady start"], run.cpu["steady end"]),
        },
        "operator_start_up_and_warm_up": {
            "api": api_summary(requests, phases["operator start-up and warm-up"]),
        },
        "operator_log": scan_operator_log(run.state_dir / "operator.log", run.phases),
        "measurement": _measurement(run, audit_files),
    }


def _software(run: Run) -> dict[str, Any]:
    return {
        "inferfleet": __version__,
        "control_plane": run.bin_dir.parent.name,
        "operator_source": run.source["at_start"],
        "operator_sources_sha256_at_end": run.source["at_end"]["operator_sources_sha256"],
        # The operator imports its code at start: a change after that did not run.
        "operator_sources_changed_during_run": run.source["at_start"]["operator_sources_sha256"]
        != run.source["at_end"]["operator_sources_sha256"],
        "engine": "sim (no GPU requested; pods placed on kwok fake L4-24GB nodes)",
    }


def _measurement(run: Run, audit_files: int) -> dict[str, Any]:
    services = run.config.services
    return {
        "ready_seen_by": "one `kubectl get inferenceservices -A --watch -o json` stream "
        f"({run.watch.get('events')} events, {run.watch.get('polls')} fallback polls)",
        "watch": run.watch,
        "percentiles": f"nearest rank over the services (p99 of {services} = "
        f"the {math.ceil(0.99 * services)}th fastest)",
        "audit_log_files": audit_files,
        "reads_counted": run.audit_policy_counts_reads,
        "reads_note": "the dev cluster's audit policy logs writes only; this run adds one rule "
        "that logs the operator's own get/list/watch (other components' reads stay unlogged)"
        if run.audit_policy_counts_reads
        else "reads are NOT counted: the audit policy logs writes only",
        "other_work_at_start": run.busy_before,
        "loadavg_before": run.loadavg_before,
        "loadavg_after": run.loadavg_after,
        "leftover_processes": run.leftovers,
    }
