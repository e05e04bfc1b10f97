"""The operator's own Prometheus series: what each autoscaler tick decided, on which metrics,
and how often reconciling failed. `inferfleet run --metrics-port` serves them.

Per autoscaled InferenceService (labels `namespace`, `service`) and per ModelDeployment and
role (`deployment`, `role`), named as the router names them so that queries join on them:

* `inferfleet_autoscaler_desired_replicas`: the replicas the last tick chose;
* `inferfleet_autoscaler_current_replicas`: the replicas the role was asked to run before it;
* `inferfleet_autoscaler_min_replicas`, `inferfleet_autoscaler_max_replicas`: the bounds;
* `inferfleet_autoscaler_decisions_total{direction,reason}`: ticks per role, by direction
  (`up`, `down`, `hold`) and the policy's reason (dashboards annotate `up` and `down`);
* `inferfleet_autoscaler_gpus_per_replica`, `inferfleet_autoscaler_gpu_hourly_price_usd`:
  what a replica costs, from the GPU catalog `status.observed` prices cost with; cost per 1M
  output tokens is `desired x GPUs x price / 3600` over the engines' generation tokens/s;
* `inferfleet_autoscaler_metrics_available` (1/0, the `MetricsAvailable` condition),
  `inferfleet_autoscaler_newest_sample_age_seconds` (the age of the newest router sample the
  tick read; absent when it read none), `inferfleet_autoscaler_last_tick_timestamp_seconds`
  and `inferfleet_autoscaler_slo_attainment_target`;

and, of the operator's own work (label `queue`: `reconcile` for ModelDeployments and
InferenceServices, `autoscale` for the services' ticks):

* `inferfleet_operator_reconcile_errors_total{kind}`: failed reconciles and handler failures
  kopf reports against an object (each failed attempt, retried or not);
* `inferfleet_operator_reconcile_duration_seconds{queue,kind}`: how long each reconcile or tick
  took, failed or not (its `_count` is the reconciles done);
* `inferfleet_operator_queue_wait_seconds{queue}`: how long a key waited for a worker once it
  was ready: the operator's lag behind the changes it must act on;
* `inferfleet_operator_queue_depth{queue}`: keys waiting for a worker now.

The series carry the resources' `namespace`: scrape the operator with `honor_labels: true`
(`honorLabels` in a ServiceMonitor), as for kube-state-metrics, or the scrape's own namespace
label replaces it. A service that stops ticking (deleted, autoscaling off, another replica
leads) drops out of every series once its last tick is `expire_after_s` old.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferfleet.api.model_deployment import Role

SERVICE_LABELS = ("namespace", "service")
ROLE_LABELS = (*SERVICE_LABELS, "deployment", "role")


class Direction(StrEnum):
    UP = "up"
    DOWN = "down"
    HOLD = "hold"

    @classmethod
    def of(cls, current: int, desired: int) -> Direction:
        if desired > current:
            return cls.UP
        if desired < current:
            return cls.DOWN
        return cls.HOLD


@dataclass(frozen=True)
class RoleRecord:
    """One role of one ModelDeployment, as one tick left it."""

    deployment: str
    role: Role
    current: int
    desired: int
    min_replicas: int
    max_replicas: int
    gpus_per_replica: int
    gpu_hourly_price_usd: float
    reason: str

    @property
    def direction(self) -> Direction:
        return Direction.of(self.current, self.desired)


@dataclass(frozen=True)
class TickRecord:
    """What one autoscaling tick of a service exports."""

    namespace: str
    service: str
    at_s: float
    """Wall-clock time of the tick (Unix seconds)."""
    metrics_available: bool
    newest_sample_age_s: float | None
    slo_attainment_target: float
    roles: tuple[RoleRecord, ...] = ()


_PREFIX = "inferfleet_autoscaler_"
# Name (after the prefix), help, and the value of each role's and each service's gauges, in the
# order they are exported.
_ROLE_GAUGES: tuple[tuple[str, str, Callable[[RoleRecord], float]], ...] = (
    ("desired_replicas", "Replicas the last tick chose.", lambda r: r.desired),
    (
        "current_replicas",
        "Replicas the role was asked to run before the last tick.",
        lambda r: r.current,
    ),
    ("min_replicas", "minReplicas of the role.", lambda r: r.min_replicas),
    ("max_replicas", "maxReplicas of the role.", lambda r: r.max_replicas),
    ("gpus_per_replica", "GPUs one replica holds.", lambda r: r.gpus_per_replica),
    (
        "gpu_hourly_price_usd",
        "Price of one GPU hour, from the GPU catalog status.observed prices cost with.",
        lambda r: r.gpu_hourly_price_usd,
    ),
)
_SERVICE_GAUGES: tuple[tuple[str, str, Callable[[TickRecord], float | None]], ...] = (
    (
        "metrics_available",
        "1 when the last tick read fresh router and engine series, else 0 (replicas held).",
        lambda t: 1.0 if t.metrics_available else 0.0,
    ),
    (
        "newest_sample_age_seconds",
        "Age of the newest router sample the last tick read.",
        lambda t: t.newest_sample_age_s,
    ),
    (
        "last_tick_timestamp_seconds",
        "When the service last ticked (Unix seconds).",
        lambda t: t.at_s,
    ),
    (
        "slo_attainment_target",
        "Fraction of requests the service's SLO says must meet it.",
        lambda t: t.slo_attainment_target,
    ),
)


RECONCILE_DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class OperatorMetrics(Collector):
    """The series above, kept from the ticks `record` is given; thread-safe (kopf runs sync
    handlers on a thread pool, the HTTP server scrapes from a thread of its own)."""

    def __init__(
        self, *, expire_after_s: float = 600.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.expire_after_s = expire_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ticks: dict[tuple[str, str], TickRecord] = {}
        self._decisions: dict[tuple[str, str], dict[tuple[str, str, str, str], int]] = {}
        self._reconcile_errors: dict[str, int] = {}
        # Histograms keep their own locks; they are exported through `collect` below.
        self._durations = Histogram(
            "inferfleet_operator_reconcile_duration_seconds",
            "How long each reconcile (or autoscaling tick) took, failed or not.",
            ["queue", "kind"],
            buckets=RECONCILE_DURATION_BUCKETS_S,
            registry=None,
        )
        self._waits = Histogram(
            "inferfleet_operator_queue_wait_seconds",
            "How long a key waited for a worker once it was ready to be reconciled.",
            ["queue"],
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=None,
        )
        self._queues: dict[str, Callable[[], int]] = {}

    def reconciled(self, queue: str, kind: str, seconds: float) -> None:
        self._durations.labels(queue, kind).observe(seconds)

    def waited(self, queue: str, seconds: float) -> None:
        self._waits.labels(queue).observe(seconds)

    def watch_queue(self, queue: str, depth: Callable[[], int]) -> None:
        """Export `depth()` (read at each scrape, from the scraping thread) as the queue's
        depth."""
        with self._lock:
            self._queues[queue] = depth

    def record(self, tick: TickRecord) -> None:
        key = (tick.namespace, tick.service)
        with self._lock:
            self._ticks[key] = tick
            counts = self._decisions.setdefault(key, {})
            for role in tick.roles:
                decision = (role.deployment, role.role.value, role.direction.value, role.reason)
                counts[decision] = counts.get(decision, 0) + 1

    def reconcile_failed(self, kind: str) -> None:
        with self._lock:
            self._reconcile_errors[kind] = self._reconcile_errors.get(kind, 0) + 1

    def _live(self) -> list[tuple[TickRecord, dict[tuple[str, str, str, str], int]]]:
        oldest = self._clock() - self.expire_after_s
        with self._lock:
            for key in [k for k, tick in self._ticks.items() if tick.at_s < oldest]:
                del self._ticks[key]
                self._decisions.pop(key, None)
            return [(tick, dict(self._decisions.get(key, {}))) for key, tick in self._ticks.items()]

    def collect(self) -> Iterator[Metric]:
        live = self._live()
        for name, documentation, role_value in _ROLE_GAUGES:
            family = GaugeMetricFamily(_PREFIX + name, documentation, labels=ROLE_LABELS)
            for tick, _ in live:
                for role in tick.roles:
                    labels = [tick.namespace, tick.service, role.deployment, role.role.value]
                    family.add_metric(labels, role_value(role))
            yield family
        decisions = CounterMetricFamily(
            _PREFIX + "decisions",
            "Autoscaling ticks per role, by direction (up, down, hold) and the policy's reason.",
            labels=[*ROLE_LABELS, "direction", "reason"],
        )
        for tick, counts in live:
            for (deployment, role_name, direction, reason), count in sorted(counts.items()):
                labels = [tick.namespace, tick.service, deployment, role_name, direction, reason]
                decisions.add_metric(labels, count)
        yield decisions
        for name, documentation, service_value in _SERVICE_GAUGES:
            family = GaugeMetricFamily(_PREFIX + name, documentation, labels=SERVICE_LABELS)
            for tick, _ in live:
                found = service_value(tick)
                if found is not None:
                    family.add_metric([tick.namespace, tick.service], found)
            yield family
        errors = CounterMetricFamily(
            "inferfleet_operator_reconcile_errors",
            "Handler failures reported against an object, by kind (each failed attempt).",
            labels=["kind"],
        )
        with self._lock:
            for kind, count in sorted(self._reconcile_errors.items()):
                errors.add_metric([kind], count)
            queues = dict(self._queues)
        yield errors
        yield from self._durations.collect()
        yield from self._waits.collect()
        depth = GaugeMetricFamily(
            "inferfleet_operator_queue_depth",
            "Keys waiting for a worker of the queue.",
            labels=["queue"],
        )
        for queue, read in sorted(queues.items()):
            depth.add_metric([queue], read())
        yield depth


class ReconcileErrorCounter(logging.Handler):
    """Counts kopf's reports of failed handlers: every failure is logged at ERROR on the
    `kopf.objects` logger with the object's reference (`k8s_ref`), retried or not. kopf has no
    other hook for them."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        super().__init__(level=logging.ERROR)
        self.metrics = metrics

    def emit(self, record: logging.LogRecord) -> None:
        reference = getattr(record, "k8s_ref", None)
        if isinstance(reference, dict):
            self.metrics.reconcile_failed(str(reference.get("kind") or "unknown"))


KOPF_OBJECT_LOGGER = "kopf.objects"


def registry_of(metrics: OperatorMetrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return registry
