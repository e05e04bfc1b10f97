"""The emulator's Prometheus metrics, named, labelled and bucketed as vLLM V1 exports them.

Exported (all with the labels `model_name` and `engine`, as vLLM's `PrometheusStatLogger`):
* gauges `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`;
* counters `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
  `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
  `vllm:num_preemptions_total` and `vllm:request_success_total{finished_reason}`;
* histograms `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds`,
  `vllm:request_time_per_output_token_seconds`, `vllm:e2e_request_latency_seconds`,
  `vllm:request_queue_time_seconds`, `vllm:request_inference_time_seconds`,
  `vllm:request_prefill_time_seconds`, `vllm:request_decode_time_seconds`,
  `vllm:request_prompt_tokens`, `vllm:request_generation_tokens`,
  `vllm:request_params_max_tokens` and `vllm:iteration_tokens_total`;
* `vllm:cache_config_info` (block size and block count, as vLLM's info gauge);
* the emulator's own: `inferfleet_sim_step_seconds_total` (modelled busy time),
  `inferfleet_sim_late_seconds_total` (summed over steps, how long after its modelled end each
  step's tokens were handed out: about a millisecond of timer overshoot per step while the
  emulator keeps up) and `inferfleet_sim_schedule_resets_total` (times the loop fell too far
  behind and stretched the emulated timeline: the process, not the modelled GPU, was the
  bottleneck).

Gauges and counters are read from the scheduler core at scrape time, so the hot path only
feeds histograms. Histograms are plain bucket arrays exposed through a custom collector: one
engine thread writes them, the scrape runs on the same event loop, no locking is needed, and
an observation is one bisect.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from inferfleet.sim.scheduler import EngineStats

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's `FINISH_REASON_STRINGS`: every `vllm:request_success` series exists from the start."""


def build_1_2_5_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM's buckets for token counts)."""
    buckets: list[float] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_value:
                return buckets
            buckets.append(value)
        scale *= 10


class Histogram:
    """Bucket counts of one series; `le` buckets as Prometheus defines them."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(float(bound) for bound in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class EngineMetrics(Collector):
    """vLLM's metric set for one engine, fed by the emulator and read at scrape time."""

    def __init__(
        self,
        model_name: str,
        stats: Callable[[], EngineStats],
        *,
        max_model_len: int,
        block_size: int,
        num_gpu_blocks: int,
        prefix_caching: bool = True,
        engine: str = "0",
    ) -> None:
        self._labels = {"model_name": model_name, "engine": engine}
        self._stats = stats
        self._cache_info = {
            "block_size": str(block_size),
            "num_gpu_blocks": str(num_gpu_blocks),
            "enable_prefix_caching": str(prefix_caching),
            "engine": engine,
        }
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(TOKEN_LATENCY_BUCKETS)
        self.time_per_output_token = Histogram(TOKEN_LATENCY_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = Histogram(token_buckets)
        self.generation_tokens = Histogram(token_buckets)
        self.max_tokens = Histogram(token_buckets)
        self.iteration_tokens = Histogram(ITERATION_TOKEN_BUCKETS)
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self.extra_generation_tokens = 0
        """Tokens a prefill replica samples and returns, which its core does not count."""
        self.step_seconds = 0.0
        self.late_seconds = 0.0
        self.schedule_resets = 0

    def request_finished(
        self,
        reason: str,
        *,
        arrival_s: float,
        scheduled_s: float | None,
        first_token_s: float | None,
        last_token_s: float | None,
        end_s: float,
        prompt_tokens: int,
        generation_tokens: int,
        max_tokens: int,
    ) -> None:
        """A request left the engine: its phases as vLLM's `FinishedRequestStats` splits them."""
        self.finished[reason] += 1
        scheduled = end_s if scheduled_s is None else scheduled_s
        first = end_s if first_token_s is None else first_token_s
        last = first if last_token_s is None else last_token_s
        self.e2e.observe(end_s - arrival_s)
        self.queue.observe(scheduled - arrival_s)
        self.prefill.observe(first - scheduled)
        self.inference.observe(last - scheduled)
        decode = last - first
        self.decode.observe(decode)
        self.time_per_output_token.observe(
            decode / (generation_tokens - 1) if generation_tokens > 1 else 0.0
        )
        self.prompt_tokens.observe(prompt_tokens)
        self.generation_tokens.observe(generation_tokens)
        self.max_tokens.observe(max_tokens)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        stats = self._stats()
        labels = self._labels
        names = list(labels)
        values = list(labels.values())

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            stats.running,
        )
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            stats.waiting,
        )
        yield gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", stats.kv_usage
        )
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            stats.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            stats.prefix_cache_hits,
        )
        yield counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            stats.preemptions,
        )
        yield counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens
        )
        yield counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            stats.generation_tokens + self.extra_generation_tokens,
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*names, "finished_reason"],
        )
        for reason, count in self.finished.items():
            success.add_metric([*values, reason], count)
        yield success

        histograms: tuple[tuple[str, str, Histogram], ...] = (
            (
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                self.prompt_tokens,
            ),
            (
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                self.generation_tokens,
            ),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                self.iteration_tokens,
            ),
            (
                "vllm:request_params_max_tokens",
                "Histogram of the max_tokens request parameter.",
                self.max_tokens,
            ),
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                self.ttft,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                self.inter_token,
            ),
            (
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
                self.time_per_output_token,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                self.e2e,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                self.queue,
            ),
            (
                "vllm:request_inference_time_seconds",
                "Histogram of time spent in RUNNING phase for request.",
                self.inference,
            ),
            (
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                self.prefill,
            ),
            (
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                self.decode,
            ),
        )
        for name, documentation, histogram in histograms:
            family = HistogramMetricFamily(name, documentation, labels=names)
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, count in zip(histogram.bounds, histogram.counts, strict=False):
                cumulative += count
                buckets.append((repr(bound), cumulative))
            buckets.append(("+Inf", cumulative + histogram.counts[-1]))
            family.add_metric(values, buckets, histogram.total)
            yield family

        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._cache_info),
        )
        info.add_metric(list(self._cache_info.values()), 1)
        yield info
        yield counter(
            "inferfleet_sim_step_seconds",
            "Modelled GPU busy time of the emulated engine, in seconds.",
            self.step_seconds,
        )
        yield counter(
            "inferfleet_sim_late_seconds",
            "Seconds by which emulated steps handed out their tokens after their modelled end.",
            self.late_seconds,
        )
        yield counter(
            "inferfleet_sim_schedule_resets",
            "Times the emulator fell too far behind the modelled time and stretched it.",
            self.schedule_resets,
        )
