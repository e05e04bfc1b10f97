"""What one install of the operator sets for everything it renders: the flags of
`inferfleet run`, the Helm chart's values. Never part of a user's spec."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferfleet.api.catalog import GpuCatalog
from inferfleet.engines import EngineOptions
from inferfleet.render.inference_service import DEFAULT_ROUTER_IMAGE
from inferfleet.render.model_deployment import Placement
from inferfleet.render.network import NetworkIsolation
from inferfleet.router.config import DiscoveryMode


@dataclass(frozen=True)
class InstallSettings:
    """`router_image`: the router pods' image (where the install pushed it);
    `router_discovery`: how those routers find replicas; `engines`: the engine adapters'
    install-wide options (the sim engine's image, the Hugging Face token Secret, cold start);
    `network`: NetworkPolicies for engines and routers, or None for none; `placement`: how
    engine pods find GPU nodes of their type; `gpus`: the GPU catalog that plans, renders and
    autoscales (the built-in one with the install's overrides)."""

    router_image: str = DEFAULT_ROUTER_IMAGE
    router_discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES
    engines: EngineOptions = field(default_factory=EngineOptions)
    network: NetworkIsolation | None = None
    placement: Placement = field(default_factory=Placement)
    gpus: GpuCatalog = field(default_factory=GpuCatalog.builtin)
