"""`inferfleet plan --recommend`: the advisor's ranking as text, JSON, or a ready
ModelDeployment (`planning.advisor`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from inferfleet.api.model_deployment import ModelDeploymentSpec, Role, TopologyMode
from inferfleet.planning.advisor import (
    Option,
    Recommendation,
    error_bands,
    rejections_by_reason,
)
from inferfleet.planning.capacity import Workload
from inferfleet.render.manifest_yaml import dump_manifests
from inferfleet.slo import Slo


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def _fleet(option: Option) -> str:
    counts = {r.role: r.replicas for r in option.plan.roles}
    if option.candidate.topology == TopologyMode.DISAGGREGATED:
        return f"disaggregated {counts[Role.PREFILL]}P:{counts[Role.DECODE]}D"
    return f"aggregated x{counts[Role.AGGREGATED]}"


def _efficiency(option: Option) -> str:
    points = [r.point for r in option.plan.roles if r.point is not None]
    mfu = max((p.mfu for p in points), default=0.0)
    mbu = max((p.mbu for p in points), default=0.0)
    return f"{mfu:.0%}/{mbu:.0%}"


def _shape(option: Option) -> str:
    candidate = option.candidate
    return f"TP{candidate.tensor}" + (f"xPP{candidate.pipeline}" if candidate.pipeline > 1 else "")


def _row(rank: int, option: Option) -> list[str]:
    return [
        str(rank),
        option.candidate.gpu_type.value,
        option.candidate.precision.label,
        _shape(option),
        _fleet(option),
        str(option.plan.gpus),
        _ms(option.ttft_p95_s),
        _ms(option.tpot_p95_s),
        _efficiency(option),
        f"${option.hourly_usd:,.2f}",
        f"${option.cost_per_million_usd:,.3f}",
        option.quality or "-",
    ]


_HEADER = [
    "#", "GPU", "precision", "shape", "fleet", "GPUs", "p95 TTFT", "p95 TPOT", "MFU/MBU",
    "$/h", "$/1M out", "quality trade-off",
]  # fmt: skip


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def _gpus(count: int) -> str:
    return f"{count} GPU" + ("" if count == 1 else "s")


def _summary(option: Option, rank: int) -> str:
    return (
        f"#{rank} {option.candidate.label} ({_fleet(option)}), {_gpus(option.plan.gpus)}, "
        f"${option.cost_per_million_usd:,.3f} per 1M output tokens, p95 TTFT "
        f"{_ms(option.ttft_p95_s)}, p95 TPOT {_ms(option.tpot_p95_s)}"
    )


def _given(recommendation: Recommendation) -> str:
    given = recommendation.given
    if given is None:
        return "not in the searched space"
    rank = recommendation.rank_of(given)
    if rank is not None:
        return _summary(recommendation.options[rank - 1], rank)
    for entry in recommendation.rejected:
        if entry.candidate in (given, replace(given, topology=None)):
            return f"{given.label}: {entry.why.value}: {entry.detail}"
    return f"{given.label}: not in the searched space (a GPU type, precision or shape it omits)"


def render_text(
    name: str, recommendation: Recommendation, workload: Workload, slo: Slo, *, top: int
) -> str:
    targets = " and ".join(
        f"p95 {label} {value:g} ms"
        for label, value in (("TTFT", slo.ttft_p95_ms), ("TPOT", slo.tpot_p95_ms))
        if value is not None
    )
    options = recommendation.options
    lines = [
        f"ModelDeployment {name}: the cheapest configurations that meet {targets or 'no target'} "
        f"at {workload.requests_per_second:g} req/s of {workload.input_tokens}/"
        f"{workload.output_tokens} tokens",
        f"  {recommendation.searched} configurations searched, {len(options)} meet the SLO; "
        "ranked by cost per 1M output tokens at this load (GPU prices from the catalog)",
    ]
    if not options:
        lines.append("  none meets the SLO")
    else:
        shown = options[:top]
        lines += ["", *("  " + line for line in _table(
            [_HEADER, *(_row(i, o) for i, o in enumerate(shown, 1))]
        ))]  # fmt: skip
        lines += ["", "  The planner's error against published points, per GPU type shown:"]
        bands = error_bands()
        for gpu in dict.fromkeys(o.candidate.gpu_type for o in shown):
            lines.append(f"    {gpu.value}: {bands[gpu].describe()}")
        lossless = recommendation.best_without_trade_off
        lines.append("")
        lines.append(
            "  Best without a quality trade-off: "
            + ("none" if lossless is None else _summary(lossless, options.index(lossless) + 1))
        )
    lines.append(f"  This ModelDeployment: {_given(recommendation)}")
    lines.append("  Rejected:")
    for why, entries in rejections_by_reason(recommendation.rejected).items():
        example = entries[0]
        lines.append(
            f"    {len(entries)} {why.value} (e.g. {example.candidate.label}: {example.detail})"
        )
    return "\n".join(lines)


def option_json(rank: int, option: Option) -> dict[str, Any]:
    band = option.band
    return {
        "rank": rank,
        "gpuType": option.candidate.gpu_type.value,
        "precision": option.candidate.precision.to_wire(),
        "parallelism": {"tensor": option.candidate.tensor, "pipeline": option.candidate.pipeline},
        "topology": option.candidate.topology.value if option.candidate.topology else None,
        "replicas": {r.role.value: r.replicas for r in option.plan.roles},
        "gpus": option.plan.gpus,
        "ttftP95Ms": option.ttft_p95_s * 1e3,
        "tpotP95Ms": option.tpot_p95_s * 1e3,
        "hourlyCostUsd": option.hourly_usd,
        "costPerMillionOutputTokensUsd": option.cost_per_million_usd,
        "qualityTradeOff": option.quality,
        "errorBand": {"throughput": band.throughput, "ttft": band.ttft, "tpot": band.tpot},
    }


def render_json(name: str, recommendation: Recommendation, *, top: int) -> dict[str, Any]:
    lossless = recommendation.best_without_trade_off
    return {
        "name": name,
        "searched": recommendation.searched,
        "meetSlo": len(recommendation.options),
        "options": [option_json(i, o) for i, o in enumerate(recommendation.options[:top], 1)],
        "bestWithoutTradeOff": None
        if lossless is None
        else option_json(recommendation.options.index(lossless) + 1, lossless),
        "given": _given(recommendation),
        "rejected": {
            why.value: len(entries)
            for why, entries in rejections_by_reason(recommendation.rejected).items()
        },
    }


def model_deployment(name: str, option: Option, given: ModelDeploymentSpec) -> str:
    """The option as a ModelDeployment to apply: its spec, with the replicas the planner sized
    for the load. Where its weights' precision differs from `given`'s, a comment says that
    `model.source` must then name a checkpoint in that precision."""
    wire = option.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    counts = {r.role: r.replicas for r in option.plan.roles}
    if option.candidate.topology == TopologyMode.DISAGGREGATED:
        wire["replicas"] = counts[Role.DECODE]
        wire["topology"]["prefill"] = {"replicas": counts[Role.PREFILL]}
    else:
        wire["replicas"] = counts[Role.AGGREGATED]
    document = {
        "apiVersion": "inferfleet.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": wire,
    }
    header = (
        f"# inferfleet plan --recommend: {option.candidate.label} ({_fleet(option)}): "
        f"${option.cost_per_million_usd:,.3f} per 1M output tokens, p95 TTFT "
        f"{_ms(option.ttft_p95_s)}, p95 TPOT {_ms(option.tpot_p95_s)}"
        + (f"; quality trade-off: {option.quality}" if option.quality else "")
        + "\n"
    )
    precision = option.candidate.precision
    if (precision.weights, precision.method) != (given.precision.weights, given.precision.method):
        header += (
            f"# weights {precision.label.split(',')[0]}, not {given.precision.weights.value} as "
            f"given: point model.source at a checkpoint in that precision\n"
        )
    return header + dump_manifests([document])
