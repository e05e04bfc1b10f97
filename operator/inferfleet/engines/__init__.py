"""Engine adapters: a ModelDeployment spec and a role -> the engine's container.

One module per engine (`vllm`, `tensorrt_llm`, `sim`), each documenting the CLI flags it uses
and where they were checked. Pure: typed API models in, plain dicts (wire form) out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferfleet.api.model_deployment import EngineName, ModelDeploymentSpec, Role, TopologyMode
from inferfleet.engines import sim, tensorrt_llm, vllm
from inferfleet.engines.common import (
    API_KEY_ENV,
    DEFAULT_COLD_START_SECONDS,
    ENGINE_CONFIG_DIR,
    ENGINE_CONFIG_VOLUME,
    ENGINE_PORT,
    MODEL_CACHE_VOLUME,
    PORT_NAME,
    SHM_GIB_PER_GPU,
    EngineContainer,
    EngineOptions,
    UnsupportedSpecError,
)

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_COLD_START_SECONDS",
    "ENGINE_CONFIG_DIR",
    "ENGINE_CONFIG_VOLUME",
    "ENGINE_PORT",
    "MODEL_CACHE_VOLUME",
    "PORT_NAME",
    "SHM_GIB_PER_GPU",
    "EngineContainer",
    "EngineOptions",
    "UnsupportedSpecError",
    "build_engine_container",
    "engine_container",
    "refusal",
    "roles_of",
]

_Builder = Callable[..., EngineContainer]

_BUILDERS: dict[EngineName, _Builder] = {
    EngineName.VLLM: vllm.build,
    EngineName.TENSORRT_LLM: tensorrt_llm.build,
    EngineName.SIM: sim.build,
}


def roles_of(spec: ModelDeploymentSpec) -> tuple[Role, ...]:
    """The pools a spec runs: one aggregated pool, or prefill and decode."""
    if spec.topology.mode == TopologyMode.DISAGGREGATED:
        return (Role.PREFILL, Role.DECODE)
    return (Role.AGGREGATED,)


def build_engine_container(
    spec: ModelDeploymentSpec,
    role: Role,
    *,
    model_name: str,
    options: EngineOptions | None = None,
) -> EngineContainer:
    """The engine container for one role, with its volumes, config files and GPU count.

    Raises `UnsupportedSpecError` for a setting the engine cannot honour, and `ValueError`
    for a role the spec's topology does not have."""
    if role not in roles_of(spec):
        modes = ", ".join(r.value for r in roles_of(spec))
        raise ValueError(
            f"role {role.value} is not one of this {spec.topology.mode.value} spec's ({modes})"
        )
    return _BUILDERS[spec.engine.name](
        spec, role, model_name=model_name, options=options or EngineOptions()
    )


def engine_container(spec: ModelDeploymentSpec, role: Role, *, model_name: str) -> dict[str, Any]:
    """Just the container dict (wire form), with the default options."""
    return build_engine_container(spec, role, model_name=model_name).container


def refusal(spec: ModelDeploymentSpec) -> str | None:
    """What the spec's engine refuses of it, in the adapter's words; None: nothing."""
    for role in roles_of(spec):
        try:
            build_engine_container(spec, role, model_name=spec.model.name)
        except UnsupportedSpecError as error:
            return str(error)
    return None
