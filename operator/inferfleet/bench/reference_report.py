"""The references of `bench autoscale` as its JSON and its text report give them: the fluid
bound, the clairvoyant schedule (with and without foresight), the per-window oracle it was
searched from and static-best."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inferfleet.api.model_deployment import Role
from inferfleet.bench.clairvoyant import Clairvoyant, LateHeadroom
from inferfleet.bench.references import FluidBound, StaticBest, attainment


def references_json(
    fluid: FluidBound, clairvoyant: Clairvoyant, best: StaticBest | None, window_s: float
) -> dict[str, Any]:
    oracle = clairvoyant.oracle
    return {
        "fluidBound": {
            "gpuHours": fluid.gpu_hours,
            "gpusPerWindow": [{r.value: g for r, g in window.items()} for window in fluid.gpus()],
        },
        "clairvoyant": {
            "gpuHours": clairvoyant.run.gpu_seconds() / 3600,
            "attainment": attainment(clairvoyant.run),
            "schedule": per_window(clairvoyant.needs),
            "servedPerWindow": per_window(clairvoyant.served(window_s)),
            "allowedMisses": clairvoyant.allowed_misses,
            "aimedMisses": clairvoyant.aimed_misses,
            "simulations": clairvoyant.simulations,
            "startedFrom": clairvoyant.started_from,
            "passes": [p.to_dict() for p in clairvoyant.passes],
            "withoutForesight": None
            if clairvoyant.unforeseen is None
            else {
                "gpuHours": clairvoyant.unforeseen.gpu_seconds() / 3600,
                "attainment": attainment(clairvoyant.unforeseen),
                "headroom": _late_headroom_json(clairvoyant.late_headroom),
            },
        },
        "perWindowOracle": {
            "gpuHours": oracle.run.gpu_seconds() / 3600,
            "attainment": attainment(oracle.run),
            "simulations": oracle.simulations,
            "schedule": per_window(oracle.needs),
        },
        "staticBest": None
        if best is None
        else {
            "replicas": {role.value: n for role, n in best.replicas.items()},
            "simulations": best.simulations,
            "tried": [
                {"replicas": {r.value: n for r, n in fleet.items()}, "attainment": value}
                for fleet, value in best.tried
            ],
        },
    }


def _late_headroom_json(headroom: LateHeadroom | None) -> dict[str, Any] | None:
    if headroom is None:
        return None
    run = headroom.run
    return {
        "factor": headroom.factor,
        "gpuHours": None if run is None else run.gpu_seconds() / 3600,
        "attainment": None if run is None else attainment(run),
        "simulations": headroom.simulations,
        "tried": [{"factor": factor, "attainment": value} for factor, value in headroom.tried],
    }


def per_window(needs: Sequence[Mapping[Role, int]]) -> list[dict[str, int]]:
    return [{role.value: count for role, count in need.items()} for need in needs]


def references_line(fluid: FluidBound, clairvoyant: Clairvoyant) -> str:
    oracle = clairvoyant.oracle
    return (
        f"References: fluid bound {fluid.gpu_hours:.2f} GPU-h; clairvoyant schedule "
        f"{clairvoyant.run.gpu_seconds() / 3600:.2f} GPU-h at attainment "
        f"{attainment(clairvoyant.run):.4f}, searched in {clairvoyant.simulations} simulations "
        f"from {clairvoyant.started_from}; the per-window oracle needs "
        f"{oracle.run.gpu_seconds() / 3600:.2f} GPU-h at {attainment(oracle.run):.4f} "
        f"({oracle.simulations} simulations).{_unforeseen_sentence(clairvoyant)}"
    )


def _unforeseen_sentence(clairvoyant: Clairvoyant) -> str:
    run = clairvoyant.unforeseen
    if run is None:
        return ""
    return (
        f" Without foresight (each window's fleet asked for as the window starts, so it serves "
        f"a cold start late) the same fleets attain {attainment(run):.4f} with "
        f"{run.gpu_seconds() / 3600:.2f} GPU-h.{_late_headroom_sentence(clairvoyant)}"
    )


def _late_headroom_sentence(clairvoyant: Clairvoyant) -> str:
    headroom = clairvoyant.late_headroom
    if headroom is None:
        return ""
    if headroom.simulations == 0 and headroom.factor is not None:
        return " Late, they meet the target as they are."
    if headroom.factor is None or headroom.run is None:
        highest = max(factor for factor, _ in headroom.tried)
        return (
            f" No headroom up to {highest:.2f}x their replicas meets the target late "
            f"({headroom.simulations} simulations)."
        )
    return (
        f" Late, they meet the target with {headroom.factor:.2f}x their replicas (the least "
        f"headroom a bisection of {headroom.simulations} simulations found): "
        f"{attainment(headroom.run):.4f} with {headroom.run.gpu_seconds() / 3600:.2f} GPU-h."
    )
