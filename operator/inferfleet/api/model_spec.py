"""The model a ModelDeployment serves: its name and source, its architecture (given in full, from
the catalog, or read from a ConfigMap), and the LoRA adapters served beside it."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final

from pydantic import Field

from inferfleet.api.catalog import ModelArchitecture, catalog_models
from inferfleet.api.common import CrossFieldRule, WireModel
from inferfleet.api.weight_cache import WeightCache

MODEL_NAME_PATTERN = r"^[a-z0-9]([a-z0-9.\-]*[a-z0-9])?$"


class WeightSource(StrEnum):
    """Where a replica's weights come from when it starts."""

    NETWORK = "network"
    """Downloaded from a model hub (`hf://`) into the pod's model cache, on every start."""
    CACHE = "cache"
    """Read from a volume shared by the pool (`pvc://`), filled once."""
    NODE_LOCAL = "nodeLocal"
    """Read from the node's own disk (a local volume the weights are already on)."""

    @classmethod
    def of(cls, uri: str) -> WeightSource | None:
        """Where the weights of a model source URI come from; None for a scheme no engine
        reads (the adapters refuse it with a condition)."""
        scheme, _, _ = uri.partition("://")
        return _SCHEME_SOURCES.get(scheme)


_SCHEME_SOURCES: Final = {"hf": WeightSource.NETWORK, "pvc": WeightSource.CACHE}


class ConfigMapKeyRef(WireModel):
    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([a-z0-9.\-]*[a-z0-9])?$",
        description="A ConfigMap in the ModelDeployment's namespace.",
    )
    key: str = Field(
        default="config.json",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key that holds the config.json.",
    )


class ArchitectureSource(WireModel):
    config_map_key_ref: ConfigMapKeyRef = Field(
        description="The ConfigMap key holding the model's Hugging Face config.json (the "
        "layouts `inferfleet architecture` reads)."
    )


class UnresolvedArchitectureError(ValueError):
    """The architecture comes from a ConfigMap the operator has not read into the spec."""


class ModelSpec(WireModel):
    name: str = Field(
        description=(
            f"Model name. A built-in catalog name ({', '.join(catalog_models())}) brings its "
            "architecture; any other name needs `architecture` (`inferfleet architecture "
            "config.json` prints it)."
        ),
        min_length=1,
        max_length=63,
        pattern=MODEL_NAME_PATTERN,
    )
    source: str = Field(
        description="Where the weights come from: hf://org/repo, pvc://claim/path, s3://bucket/"
        "prefix or oci://registry/repo:tag.",
        max_length=512,
        pattern=r"^(hf|pvc|s3|oci)://[^\s]+$",
    )
    architecture: ModelArchitecture | None = Field(
        default=None,
        description="The model's shape, given in full; overrides the catalog entry of `name`.",
    )
    architecture_from: ArchitectureSource | None = Field(
        default=None,
        description="Where the operator reads the model's shape: its Hugging Face config.json "
        "in a ConfigMap of this namespace. Instead of `architecture`, and like it overrides "
        "the catalog entry of `name`; the rules that need the shape are then checked by the "
        "operator, not at apply.",
    )
    cache: WeightCache | None = Field(
        default=None,
        description="Fill a PersistentVolumeClaim once with the weights of an hf:// source; "
        "every replica then reads them from it instead of downloading them at each start, "
        "once the fill is complete.",
    )

    @property
    def weight_source(self) -> WeightSource | None:
        """Where a replica's weights come from when it starts: a cached hub source is read
        from its volume."""
        return WeightSource.CACHE if self.cache is not None else WeightSource.of(self.source)


# The LoRA ranks vLLM's --max-lora-rank takes; an adapter's rank is rounded up to one.
LORA_RANKS: Final = (8, 16, 32, 64, 128, 256, 320, 512)


class LoraAdapter(WireModel):
    """A LoRA adapter of the base model, served under its own name beside it."""

    name: str = Field(
        description="The name requests use for the adapter (their `model`).",
        min_length=1,
        max_length=63,
        pattern=MODEL_NAME_PATTERN,
    )
    source: str = Field(
        description="Where the adapter's weights come from: hf://org/repo or pvc://claim/path.",
        max_length=512,
        pattern=r"^(hf|pvc)://[^\s]+$",
    )
    rank: int = Field(
        ge=1,
        le=max(LORA_RANKS),
        description="The adapter's LoRA rank (`r` in its adapter_config.json): sizes the GPU "
        "memory the engines reserve for adapters.",
    )


def lora_slot_rank(adapters: list[LoraAdapter]) -> int:
    """The rank of the engines' adapter slots: the largest adapter's, rounded up to a rank
    vLLM takes (0 without adapters)."""
    if not adapters:
        return 0
    largest = max(a.rank for a in adapters)
    return next(rank for rank in LORA_RANKS if rank >= largest)


MODEL_RULES: tuple[CrossFieldRule[ModelSpec], ...] = (
    CrossFieldRule(
        cel="has(self.architecture) || has(self.architectureFrom) || self.name in "
        + json.dumps(sorted(catalog_models())),
        message="model.name is not in the built-in catalog; give model.architecture in full "
        "or model.architectureFrom",
        holds=lambda m: (
            m.architecture is not None
            or m.architecture_from is not None
            or m.name in catalog_models()
        ),
        field_path=".name",
    ),
    CrossFieldRule(
        cel="!has(self.architecture) || !has(self.architectureFrom)",
        message="give model.architecture or model.architectureFrom, not both",
        holds=lambda m: m.architecture is None or m.architecture_from is None,
        field_path=".architectureFrom",
    ),
    CrossFieldRule(
        cel="!has(self.cache) || self.source.startsWith('hf://')",
        message="model.cache fills a volume from a model hub: it needs an hf:// source (a "
        "pvc:// source is read from its volume already)",
        holds=lambda m: m.cache is None or m.source.startswith("hf://"),
        field_path=".cache",
    ),
)
ModelSpec.cross_field_rules = MODEL_RULES
