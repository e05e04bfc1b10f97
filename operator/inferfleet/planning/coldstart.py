"""How long a new replica takes to serve, from where its weights come from and their size.

A cold start, container started to engine healthy, is three steps in sequence:
* **download** (weights from a model hub only): the whole checkpoint, once per node, at the
  hub's rate to one node;
* **load**: each GPU rank reads its shard of the safetensors into device memory, all ranks
  at once; from a shared volume, no faster than the volume serves one node;
* **engine start**: imports, graph compilation, CUDA-graph capture and the KV-cache profile;
  it depends on the engine, not on where the weights came from.

The rates are published measurements, named beside each. They err long where sources differ:
a plan that assumes a slow start orders capacity early, one that assumes a fast start orders it
late, and the SLO pays for lateness. The image pull and a wait for a GPU node are not modelled:
they depend on the node, and the autoscaler's measured cold starts (`autoscale.policy.coldstart`)
replace this estimate where they differ by more than a quarter. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from inferfleet.api.model_deployment import EngineName
from inferfleet.api.model_spec import WeightSource
from inferfleet.planning.memory import weight_bytes_per_gpu
from inferfleet.planning.replica import ReplicaConfig

GB: Final = 1e9


HUB_DOWNLOAD_BYTES_PER_S: Final = 0.26 * GB
"""One node's download from the Hugging Face hub: 16 GB (Llama-3.1-8B-Instruct, bf16) in 61 s,
measured by Tensorfuse on an L40S node ("Reducing GPU Cold Start Time when using vLLM",
September 2025)."""

RANK_LOAD_BYTES_PER_S: Final = 0.5 * GB
"""One GPU rank reading safetensors into device memory with the engines' default loader: 16 GB
in 33 s on one L40S (Tensorfuse, as above), and DeepSeek-R1 on 8 H200 at 4.3 GB/s, 0.54 GB/s a
rank (vLLM's InstantTensor page, its safetensors baseline). Faster points exist (1.1 GB/s on one
H200, same page), so this errs long."""

SHARED_VOLUME_BYTES_PER_S: Final = 1.5 * 2**30
"""What a shared file system serves one node: Amazon EFS's documented maximum per client,
1,500 MiB/s. The ranks of a node share it."""

ENGINE_START_S: Final[dict[EngineName, float]] = {
    EngineName.VLLM: 200.0,
    EngineName.TENSORRT_LLM: 200.0,
    EngineName.SIM: 1.0,
}
"""From weights loaded to healthy. vLLM: bytecode transformation 10 s, graph compilation 42 s,
CUDA-graph capture 54 s, engine init and imports 94 s, with no compile cache (Tensorfuse, as
above). TensorRT-LLM: no published breakdown found; vLLM's figure is used. The emulator holds
no weights and starts in about a second."""


@dataclass(frozen=True)
class ColdStartEstimate:
    source: WeightSource
    checkpoint_bytes: float
    """The weights one replica reads, all ranks together."""
    download_s: float
    load_s: float
    engine_start_s: float

    @property
    def seconds(self) -> float:
        return self.download_s + self.load_s + self.engine_start_s

    def describe(self) -> str:
        if not self.checkpoint_bytes:
            return f"about {self.seconds:.0f} s: the engine loads no weights"
        parts = []
        if self.download_s:
            parts.append(f"download {self.download_s:.0f} s")
        parts.append(f"load {self.load_s:.0f} s")
        parts.append(f"engine start {self.engine_start_s:.0f} s")
        return (
            f"about {self.seconds:.0f} s with {self.checkpoint_bytes / GB:.1f} GB of weights "
            f"from {_FROM[self.source]}: {', '.join(parts)}"
        )


_FROM: Final[dict[WeightSource, str]] = {
    WeightSource.NETWORK: "the model hub",
    WeightSource.CACHE: "a shared volume",
    WeightSource.NODE_LOCAL: "the node's disk",
}


def estimate_cold_start(
    config: ReplicaConfig, source: WeightSource, engine: EngineName
) -> ColdStartEstimate:
    """A replica's cold start: download (hub only), load and engine start, in sequence. A
    replica over several nodes starts them in parallel, each with its own share of the
    weights; the emulator reads none."""
    start = ENGINE_START_S[engine]
    per_gpu = weight_bytes_per_gpu(config)
    checkpoint = per_gpu * config.gpus
    if engine == EngineName.SIM:
        return ColdStartEstimate(source, 0.0, 0.0, 0.0, start)
    per_node = checkpoint / config.nodes
    download = per_node / HUB_DOWNLOAD_BYTES_PER_S if source == WeightSource.NETWORK else 0.0
    load = per_gpu / RANK_LOAD_BYTES_PER_S
    if source == WeightSource.CACHE:
        load = max(load, per_node / SHARED_VOLUME_BYTES_PER_S)
    return ColdStartEstimate(source, checkpoint, download, load, start)
