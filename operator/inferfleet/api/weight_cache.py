"""A ModelDeployment's weight cache (`spec.model.cache`): a PersistentVolumeClaim the operator
creates and fills once with the weights of a hub source, which every replica of the
deployment, of any pool, then reads instead of downloading them at each start; and its state
as `status.weightCache` reports it."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from inferfleet.api.common import StatusModel, WireModel
from inferfleet.api.scheduling import ObjectName, Quantity


class CacheAccessMode(StrEnum):
    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE = "ReadWriteOnce"


class WeightCache(WireModel):
    """Fill a volume with the model's weights once; the engines read them from it."""

    size: Quantity | None = Field(
        default=None,
        description="The volume's size (64Gi). Default: the model's parameters at 16 bits plus "
        "10%, what a hub's 16-bit checkpoint takes (a quantized checkpoint takes less).",
    )
    storage_class_name: ObjectName | None = Field(
        default=None,
        description="The StorageClass of the volume; the cluster's default class when unset.",
    )
    access_mode: CacheAccessMode = Field(
        strict=False,
        default=CacheAccessMode.READ_WRITE_MANY,
        description="ReadWriteMany: the fill and the replicas may run on any nodes (a class "
        "whose volumes many nodes mount, such as a network filesystem). ReadWriteOnce: they "
        "all run on the node that mounts it.",
    )


class FillPhase(StrEnum):
    PENDING = "Pending"
    """The fill has not started: its pod waits for the volume, a node or its image."""
    FILLING = "Filling"
    FILLED = "Filled"
    FAILED = "Failed"
    """The fill Job gave up (its retries spent); the replicas stay at zero."""


class WeightCacheStatus(StatusModel):
    """The fill of the weight cache, as its Job and the fill's own pushes report it."""

    claim: str = Field(description="The PersistentVolumeClaim that holds the weights.")
    source: str = Field(description="The hub source it is filled from.")
    phase: FillPhase = Field(description="Pending, Filling, Filled or Failed.")
    size: str = Field(description="The volume's requested size.")
    bytes_total: int | None = Field(
        default=None, ge=0, description="The weights' size at the source, once listed."
    )
    bytes_filled: int | None = Field(
        default=None, ge=0, description="What is on the volume, whole files only."
    )
    revision: str | None = Field(
        default=None, description="The source's commit the volume holds (or is filled from)."
    )
    completion_time: str | None = Field(default=None, description="When the fill ended.")
    message: str = Field(default="", description="The fill's state in words.")
