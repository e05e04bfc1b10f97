"""The planner's verdict on a ModelDeployment's spec, as its status reports it
(`status.plan`)."""

from __future__ import annotations

from pydantic import Field

from inferfleet.api.common import StatusModel
from inferfleet.api.model_spec import WeightSource


class MemoryBreakdown(StatusModel):
    """Per-GPU memory, in GiB, as the planner accounts for it."""

    total_gib: float = Field(description="Device memory of one GPU.")
    usable_gib: float = Field(description="What the engine may use (total x memoryUtilization).")
    weights_gib: float = Field(description="This GPU's shard of the weights.")
    activation_gib: float = Field(description="Peak activations of one full step.")
    runtime_gib: float = Field(description="CUDA context, graphs, communication buffers.")
    kv_cache_gib: float = Field(description="What is left for the KV cache (negative: no fit).")


class ColdStartEstimateStatus(StatusModel):
    """How long a new replica is expected to take to serve, from its weights' source and size."""

    weight_source: WeightSource = Field(
        description="Where the weights come from: network (downloaded from a model hub on "
        "every start), cache (a shared volume) or nodeLocal (the node's disk)."
    )
    estimated_seconds: float = Field(
        ge=0, description="Download, load and engine start, in sequence; no image pull."
    )
    message: str = Field(default="", description="The parts of the estimate, in words.")


class CapacityPlanStatus(StatusModel):
    """The planner's verdict for one replica of this spec."""

    fits: bool = Field(description="Whether weights, reserves and one full sequence fit.")
    gpus_per_replica: int = Field(description="tensor x pipeline.")
    memory_per_gpu: MemoryBreakdown = Field(description="Memory accounting of one GPU.")
    kv_capacity_tokens: int = Field(description="KV-cache capacity of one replica, in tokens.")
    max_concurrency: int = Field(
        description="Sequences of max model length one replica holds at once."
    )
    predicted_ttft_ms: float | None = Field(
        default=None,
        description="Predicted TTFT on an idle replica, for the planned request shape (the "
        "InferenceService's expectedLoad, else 1000 prompt and 200 output tokens).",
    )
    predicted_tpot_ms: float | None = Field(
        default=None,
        description="Predicted TPOT at a batch of one, for the planned request shape.",
    )
    message: str = Field(default="", description="The verdict in words, with numbers.")
    cold_start: ColdStartEstimateStatus | None = Field(
        default=None,
        description="The estimated cold start of one replica: the autoscaler plans with it "
        "where the InferenceService sets no coldStartSeconds.",
    )
