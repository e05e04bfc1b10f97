"""The report: `operator_scale.md`, from the summarised figures (pure: a dict in, text out).

First the operator's scale goals, each beside its figure, met or not; then the baselines (bare
Deployments, a single service), the operator-attributable latencies, and the detailed
sections: where the rollout's time went, CPU by process, writes by client, the operator's
requests and log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.operator_scale.audit import LATENCY_STEPS


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def markdown(result: Mapping[str, Any]) -> str:
    sections = (
        _header(result),
        _goals_table(result),
        _bare_section(result),
        _latency_section(result),
        _figures_table(result),
        _stages_section(result),
        _cpu_sections(result),
        _api_section(result),
        _log_section(result["operator_log"]),
        _measurement_section(result),
    )
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def _header(result: Mapping[str, Any]) -> list[str]:
    hw = result["hardware"]
    return [
        f"# Operator scale: {result['config']['services']} services in one apply",
        "",
        f"Run {result['run_at']} on {hw['cpu_model']}, {hw['cores']} cores, "
        f"{hw['memory_gib']} GiB (kernel {hw['kernel']}, Python {hw['python']}); control "
        f"plane {result['software']['control_plane']}; nodes {result['config']['node_pools']} "
        f"and {result['config']['cpu_nodes']} CPU nodes; operator at "
        f"{result['software']['operator_source'].get('commit', '?')}"
        + (
            " with uncommitted changes"
            if result["software"]["operator_source"].get("operator_files_changed_since_commit")
            else ""
        )
        + ".",
        "Everything (etcd, API server, controller manager, scheduler, kwok, the operator and "
        "the benchmark) shares those cores. The controller manager's and the scheduler's "
        f"client limits are raised to {_client_rate(result)}, so the operator is what is "
        "measured.",
    ]


def _figures_table(result: Mapping[str, Any]) -> list[str]:
    head = result["headline"]
    services = result["config"]["services"]
    single = head["single_service_ready_s"]
    return [
        "## All figures",
        "",
        "| figure | value |",
        "|---|---|",
        f"| services Ready | {head['services_ready']}/{services} |",
        f"| single service alone, time to Ready (median of "
        f"{len(result['baseline']['ready_s'])}) | {single:.2f} s |",
        f"| `kubectl apply` of {2 * services} objects | {head['apply_s']:.1f} s |",
        f"| time to all Ready | {_fmt(head['all_ready_s'])} s "
        f"(= {_fmt(head['all_ready_x_single'])} x single, "
        f"{_fmt(head['all_ready_x_bare'])} x bare Deployments) |",
        f"| bare Deployments, time to all rolled out | {_fmt(head['bare_all_rolled_out_s'])} s |",
        f"| everything rendered, applied bare: time to all rolled out | "
        f"{_fmt(head.get('bare_rendered_all_rolled_out_s'))} s "
        f"(all Ready = {_fmt(head.get('all_ready_x_bare_rendered'))} x) |",
        f"| per-service time to Ready, p50 | {_fmt(head['p50_ready_s'])} s "
        f"(= {_fmt(head['p50_x_single'])} x single) |",
        f"| per-service time to Ready, p99 | {_fmt(head['p99_ready_s'])} s "
        f"(= {_fmt(head['p99_x_single'])} x single) |",
        f"| operator peak RSS (VmHWM) | {head['operator_peak_rss_mib']} MiB |",
        f"| operator CPU, whole run / rollout to all Ready / rollout until quiet | "
        f"{head['operator_cpu_s_total']} s / {head['operator_cpu_s_rollout']} s / "
        f"{head['operator_cpu_s_rollout_until_quiet']} s |",
        f"| operator CPU per service, rollout / single | "
        f"{head['operator_cpu_s_per_service_rollout']} s / "
        f"{head['operator_cpu_s_per_service_single']} s |",
        f"| operator CPU per reconcile (rollout until quiet / reconciled resources) | "
        f"{head['operator_cpu_ms_per_reconcile']} ms |",
        f"| operator CPU per reconcile / the API server's CPU per bare Deployment (same run: "
        f"the machine's speed cancels) | {_per_bare_deployment(result)} |",
        f"| operator reconciles per reconciled resource (its own metrics); CPU per reconcile run | "
        f"{_fmt(head.get('operator_reconciles_per_resource'))}; "
        f"{_fmt(head.get('operator_cpu_ms_per_reconcile_run'))} ms |",
        f"| operator writes per reconciled resource, rollout / single | "
        f"{_fmt(head['operator_writes_per_resource_rollout'])} / "
        f"{_fmt(head['operator_writes_per_resource_single'])} |",
        f"| operator reads per reconciled resource, rollout / single | "
        f"{_fmt(head['operator_reads_per_resource_rollout'])} / "
        f"{_fmt(head['operator_reads_per_resource_single'])} |",
        f"| operator quiet (CPU under 2 % of a core for {result['config']['settle_s']:g} s) "
        f"after all Ready | {_quiet(head['operator_quiet_after_all_ready_s'], result)} |",
        f"| operator writes / reads in the steady minute | "
        f"{head['operator_writes_steady_minute']} / {head['operator_reads_steady_minute']} |",
        "",
        "A reconciled resource is one ModelDeployment or one InferenceService "
        f"({2 * services} in the rollout, 2 per single service).",
    ]


def _per_bare_deployment(result: Mapping[str, Any]) -> str:
    """The operator's CPU per reconciled resource over what the API server spent per Deployment
    in the bare baseline: CPU seconds differ twofold between runs on hosts that report the same
    CPU model, and a ratio of two figures of one run does not."""
    bare = result["bare_deployments"]
    api_s = bare["cpu"]["cpu_s_by_process"].get("kube-apiserver")
    operator_ms = result["headline"]["operator_cpu_ms_per_reconcile"]
    if not api_s or not bare["deployments"] or operator_ms is None:
        return "-"
    api_ms = 1000 * api_s / bare["deployments"]
    return f"{operator_ms} ms / {api_ms:.2f} ms = {operator_ms / api_ms:.2f}"


def _stages_section(result: Mapping[str, Any]) -> list[str]:
    lines = [
        "## Where the rollout's time went",
        "",
        "Per step, over the services: its time after the start of the apply, and after the "
        "step before it for the same service (the gap: who kept it waiting). Steps are "
        "requests in the audit log (microsecond timestamps) and the operator's own Ready "
        "conditions.",
        "",
        "| step | after apply p50 s | p99 s | max s | gap p50 s | gap p99 s | gap max s |",
        "|---|---|---|---|---|---|---|",
    ]
    stage_times = result["rollout"]["stages_s"] or {"offsets": {}, "gaps": {}}
    for step, dist in stage_times["offsets"].items():
        gap = stage_times["gaps"].get(step)
        if dist:
            gap_cells = f"{gap['p50']} | {gap['p99']} | {gap['max']}" if gap else "- | - | -"
            lines.append(
                f"| {step} | {dist['p50']} | {dist['p99']} | {dist['max']} | {gap_cells} |"
            )
    pods = result["rollout"]["pods_at_the_end"] or {}
    lines += [
        "",
        f"Pods at the end: {pods.get('by_phase')}; unschedulable: {pods.get('unschedulable')}"
        + (f" ({pods['unschedulable_example']})" if pods.get("unschedulable_example") else "")
        + ".",
    ]
    return lines


def _cpu_sections(result: Mapping[str, Any]) -> list[str]:
    lines = ["## CPU seconds during the rollout (apply to all Ready)", ""]
    lines += _cpu_table(result["rollout"]["cpu"])
    timeline = result["rollout"]["cores_used_per_10s"]
    if timeline:
        lines += [
            "",
            "Cores used, 10 s windows from the apply (2 = the whole machine):",
            "",
            "| from s | " + " | ".join(f"{t:g}" for t in timeline["from_s"]) + " |",
            "|---|" + "---|" * len(timeline["from_s"]),
        ]
        for name, values in timeline.items():
            if name != "from_s":
                lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    lines += ["", "Writes by client during the rollout:", ""]
    lines += _writers_table(result["rollout"]["writes_by_user"])
    lines += ["", "## CPU seconds during the steady minute", ""]
    lines += _cpu_table(result["steady"]["cpu"])
    lines += ["", "Writes by client during the steady minute:", ""]
    lines += _writers_table(result["steady"]["writes_by_user"])
    return lines


def _api_section(result: Mapping[str, Any]) -> list[str]:
    lines = ["## The operator's API requests", ""]
    lines += _api_table(
        {
            "single service": result["baseline"]["api"][0] if result["baseline"]["api"] else {},
            "rollout": result["rollout"]["api"],
            "steady minute": result["steady"]["api"],
        }
    )
    per_service = result["rollout"]["operator_writes_per_service"] or {}
    if per_service:
        lines += [
            "",
            "The operator's writes per service during the rollout (over the services; "
            "`-aggregated` is the engine's object, `-router` the router's):",
            "",
            "| write | min | p50 | max |",
            "|---|---|---|---|",
        ]
        for kind, dist in per_service.items():
            if dist:
                lines.append(f"| {kind} | {dist['min']:g} | {dist['p50']:g} | {dist['max']:g} |")
    return lines


def _log_section(log: Mapping[str, Any]) -> list[str]:
    lines = [
        "## Operator log",
        "",
        f"{log['lines']} lines ({log['bytes'] // 1024} KiB), by level {log['by_level']}, "
        f"{log['tracebacks']} tracebacks.",
    ]
    handler_runs = log["handler_runs_by_phase"]
    shown = [name for name in handler_runs if name == "rollout" or name.endswith("single-0")]
    if shown:
        lines += ["", "Handler runs (one kopf log line each):", ""]
        lines += ["| handler | " + " | ".join(shown) + " |", "|---|" + "---|" * len(shown)]
        handler_names = sorted({h for name in shown for h in handler_runs[name]})
        for handler in handler_names:
            counts = " | ".join(str(handler_runs[name].get(handler, 0)) for name in shown)
            lines.append(f"| {handler} | {counts} |")
    if log["problems"]:
        lines.append("")
    for problem in log["problems"]:
        lines.append(f"- {problem['count']} x `{problem['example'][:300]}`")
    return lines


def _measurement_section(result: Mapping[str, Any]) -> list[str]:
    measurement = result["measurement"]
    return [
        "## How it was measured",
        "",
        f"- Ready seen by {measurement['ready_seen_by']}; percentiles: "
        f"{measurement['percentiles']}.",
        f"- API requests from the API server's audit log; {measurement['reads_note']}; "
        "the bodies of readiness status writes (`deployments/status`, "
        "`modeldeployments/status`, `inferenceservices/status`) are logged too, for the "
        "operator-attributable latencies.",
        "- CPU seconds: utime + stime from /proc/<pid>/stat; peak RSS: VmHWM from "
        "/proc/<pid>/status.",
        f"- Benchmark overhead during the rollout: "
        f"{result['rollout']['cpu']['benchmark_python_cpu_s']} s of its own Python, "
        f"{result['rollout']['cpu']['benchmark_kubectl_runs_cpu_s']} s in short kubectl runs "
        "(the apply itself), and the watch's kubectl in the table above.",
        f"- Load average before / after: {measurement['loadavg_before']} / "
        f"{measurement['loadavg_after']}; other control planes or test runs at the start: "
        f"{len(measurement['other_work_at_start']) or 'none'}.",
        f"- Processes left after the run: {measurement['leftover_processes'] or 'none'}.",
    ]


def _cpu_table(cpu: Mapping[str, Any]) -> list[str]:
    lines = [
        f"{cpu['wall_s']} s of wall time = {cpu['machine_capacity_cpu_s']} CPU s of capacity; "
        f"{cpu['machine_busy_cpu_s']} CPU s busy.",
        "",
        "| process | CPU s |",
        "|---|---|",
    ]
    for name, seconds in cpu["cpu_s_by_process"].items():
        lines.append(f"| {name} | {seconds} |")
    lines += [
        f"| benchmark (Python) | {cpu['benchmark_python_cpu_s']} |",
        f"| benchmark (short kubectl runs) | {cpu['benchmark_kubectl_runs_cpu_s']} |",
        f"| other processes on the machine | {cpu['other_processes_cpu_s']} |",
    ]
    return lines


def _writers_table(writes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    if not writes:
        return ["(none)"]
    lines = ["| client | writes | mean /s | busiest 10 s, /s |", "|---|---|---|---|"]
    for user, figures in writes.items():
        lines.append(
            f"| {user} | {figures['writes']} | {figures['mean_per_s']} | "
            f"{figures['busiest_10s_per_s']} |"
        )
    return lines


def _api_table(windows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    keys: list[str] = []
    for api in windows.values():
        for key in [*api.get("writes_by_request", {}), *api.get("reads_by_request", {})]:
            if key not in keys:
                keys.append(key)
    lines = [
        "| request | " + " | ".join(windows) + " |",
        "|---|" + "---|" * len(windows),
    ]
    for key in keys:
        counts = [
            str(
                api.get("writes_by_request", {}).get(key)
                or api.get("reads_by_request", {}).get(key)
                or 0
            )
            for api in windows.values()
        ]
        lines.append(f"| {key} | " + " | ".join(counts) + " |")
    lines.append(
        "| **writes** | " + " | ".join(str(a.get("writes", 0)) for a in windows.values()) + " |"
    )
    lines.append(
        "| **reads** | " + " | ".join(str(a.get("reads", 0)) for a in windows.values()) + " |"
    )
    failed = {name: api.get("failed") for name, api in windows.items() if api.get("failed")}
    if failed:
        lines += ["", f"Failed requests (HTTP status >= 300): {failed}."]
    return lines


def _quiet(after_s: float | None, result: Mapping[str, Any]) -> str:
    if after_s is None:
        return f"not within {result['config']['quiet_timeout_s']:g} s"
    return f"{after_s:g} s"


def _client_rate(result: Mapping[str, Any]) -> str:
    rate = result["config"]["controller_manager_and_scheduler_client"]
    return f"`--kube-api-qps={rate['kube_api_qps']:g} --kube-api-burst={rate['kube_api_burst']}`"


def _met(met: bool | None) -> str:
    return "not measured" if met is None else "met" if met else "**not met**"


def _goal_value(result: Mapping[str, Any], figure: str, value: Any) -> str:
    head = result["headline"]
    for step in LATENCY_STEPS:
        if figure.endswith(step):
            latency = head["operator_latency_s"].get(step) or {}
            return f"p50 {_fmt(latency.get('p50'))} s, p99 {_fmt(latency.get('p99'))} s"
    if figure.startswith("time to all Ready"):
        return (
            f"{_fmt(head['all_ready_s'])} s / {_fmt(head['bare_all_rolled_out_s'])} s "
            f"= {_fmt(value)}x"
        )
    if figure.endswith("CPU per reconcile"):
        return f"{_fmt(value)} ms"
    if figure.endswith("RSS"):
        return f"{_fmt(value)} MiB"
    return _fmt(value)


def _goals_table(result: Mapping[str, Any]) -> list[str]:
    goals: Sequence[Mapping[str, Any]] = result["goals"]
    met = sum(1 for goal in goals if goal["met"])
    lines = [
        "## Goals",
        "",
        f"{met} of {len(goals)} met.",
        "",
        "| figure | value | goal | |",
        "|---|---|---|---|",
    ]
    for goal in goals:
        lines.append(
            f"| {goal['figure']} | {_goal_value(result, goal['figure'], goal['value'])} | "
            f"{goal['goal']} | {_met(goal['met'])} |"
        )
    return lines


def _bare_table(bare: Mapping[str, Any]) -> list[str]:
    spread = bare["rolled_out_s"] or {}
    return [
        "| figure | value |",
        "|---|---|",
        f"| Deployments rolled out | {bare['rolled_out']}/{bare['deployments']} |",
        f"| `kubectl apply` of {bare['objects']} objects | {bare['apply_s']:.1f} s |",
        f"| time to all rolled out | {_fmt(bare['all_rolled_out_s'])} s |",
        f"| per-Deployment time to rolled out, p50 / p99 | {_fmt(spread.get('p50'))} s / "
        f"{_fmt(spread.get('p99'))} s |",
        "",
        "CPU seconds from the apply to all rolled out:",
        "",
        *_cpu_table(bare["cpu"]),
        "",
        "Writes by client, apply to all rolled out:",
        "",
        *_writers_table(bare["writes_by_user"]),
    ]


def _bare_section(result: Mapping[str, Any]) -> list[str]:
    bare = result["bare_deployments"]
    lines = [
        "## Baseline: the same engine Deployments, no operator",
        "",
        f"Before the operator starts, the {bare['deployments']} engine Deployments the operator "
        "renders for these ModelDeployments (the package's own renderer, `inferfleet run`'s "
        "defaults, no owner) in one `kubectl apply --server-side`, each timed to rolled out "
        "(seen by one `kubectl get deployments --watch` stream); then deleted, and gone after "
        f"{bare['deleted_s']} s, before the operator starts.",
        "",
        *_bare_table(bare),
    ]
    rendered = result.get("bare_rendered")
    if rendered:
        head = result["headline"]
        lines += [
            "",
            "## Baseline: everything the operator renders, no operator",
            "",
            f"Then, the same way, all {rendered['objects']} objects the operator renders for "
            "the services: each ModelDeployment's engine Deployment, Service and "
            "PodDisruptionBudget, and each InferenceService's router (a Deployment of two "
            "pods, its Service, PodDisruptionBudget, ServiceAccount, Role and RoleBinding); "
            f"the {rendered['deployments']} Deployments timed to rolled out, then deleted, and "
            f"gone after {rendered['deleted_s']} s. What the cluster itself spends on those "
            "objects: time to all Ready over this time is what the operator adds to it "
            f"({_fmt(head['all_ready_s'])} s / {_fmt(rendered['all_rolled_out_s'])} s = "
            f"{_fmt(head['all_ready_x_bare_rendered'])}x).",
            "",
            *_bare_table(rendered),
        ]
    return lines


def _latency_section(result: Mapping[str, Any]) -> list[str]:
    latency = result["operator_latency_s"]
    lines = [
        "## Operator-attributable latency",
        "",
        "Per resource, from the moment what the operator waits for was stored to the moment its "
        "answer was (the completion of each request in the audit log): a ModelDeployment's "
        "creation by the apply -> the operator's first write of any object it renders for it; "
        "the Deployment controller's status write that left its engine Deployment rolled out "
        "-> the operator's status write that left it Ready=True; the later of an "
        "InferenceService's last ModelDeployment Ready and a pod of its router available -> "
        "its own Ready=True.",
        "",
        "| step | n | min s | p50 s | p90 s | p99 s | max s | not seen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for step in LATENCY_STEPS:
        dist = latency["steps"].get(step) or {}
        cells = " | ".join(_fmt(dist.get(key)) for key in ("n", "min", "p50", "p90", "p99", "max"))
        lines.append(f"| {step} | {cells} | {latency['missing'].get(step, 0)} |")
    return lines
