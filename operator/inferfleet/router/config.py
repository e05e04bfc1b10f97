"""What one router serves: its InferenceService, the backends (a ModelDeployment's role each),
the SLO it judges requests by, and its limits. Pure.

A backend is given as comma-separated `key=value` pairs, as the renderer writes them:

    deployment=NAME,role=ROLE,engine=ENGINE,weight=W,model=SERVED_NAME,context=TOKENS,
    service=SVC,port=8000

and, where the deployment serves LoRA adapters, `adapters=NAME;NAME`: requests for any of them
go to that deployment, as for the base model (every replica holds every adapter).

`context` is the deployment's longest prompt plus output (its engines' max model length): the
most tokens a request can make a replica work for.

`service` names the Kubernetes Service whose EndpointSlices list the role's pods (or, with
`--discovery pods`, whose selector picks them). Outside a cluster, `urls=URL;URL` lists the
replicas instead (each `http://host:port`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import urlsplit

from inferfleet.api.model_deployment import EngineName, Role
from inferfleet.router.flags import key_values
from inferfleet.router.tenants import TenantSpec
from inferfleet.slo import Slo

_BACKEND_KEYS = (
    "deployment", "role", "engine", "weight", "model", "context", "seqs", "service", "port",
    "urls", "keyfile", "adapters",
)  # fmt: skip
ADMIN_PORT = 8001
"""Default port of the router's admin listener (metrics, debug pages): never the users' port,
so that a NetworkPolicy can open it to Prometheus alone."""
MIB = 1024**2
BODY_BYTES_PER_CONTEXT_TOKEN = 32
"""A request body's bytes per token of context, at most: about four characters a token, each
up to six bytes as a JSON escape, plus the envelope. A body beyond the model's context in this
measure cannot be a prompt the model takes."""
BODY_BYTES_RANGE = (1 * MIB, 16 * MIB)
LONGEST_CONTEXT = 10_485_760
"""The most tokens any model of the catalog takes (`ModelArchitecture.max_context_length`'s
bound): what a backend given without `context` is taken to hold."""
_REQUIRED_KEYS = ("deployment", "role", "engine", "model")


class DiscoveryMode(StrEnum):
    """Where a router finds the replicas behind a backend's Service."""

    ENDPOINT_SLICES = "endpointslices"
    """The ready endpoints of the Service's EndpointSlices: the normal way in a cluster."""
    PODS = "pods"
    """The Ready pods the Service's selector picks, at their pod IP: for clusters whose pod
    addresses EndpointSlices refuse (the dev cluster's loopback ones)."""


class RouterConfigError(ValueError):
    """A router flag that cannot be used, with what is wrong."""


@dataclass(frozen=True, slots=True)
class Backend:
    """One role of one ModelDeployment behind the service."""

    deployment: str
    role: Role
    engine: EngineName
    model: str
    weight: int = 100
    service: str | None = None
    port: int = 8000
    urls: tuple[str, ...] = ()
    context: int = LONGEST_CONTEXT
    sequences: int | None = None
    """Sequences a replica batches at once (the engine's limit); None: not known, and the
    router admits every request at once (`fairness.FairGate`)."""
    key_file: str | None = None
    """A file holding the bearer key the engines require (a mounted Secret); None: none."""
    adapters: tuple[str, ...] = ()
    """LoRA adapters the replicas serve by name beside `model`."""

    @property
    def key(self) -> tuple[str, Role]:
        return (self.deployment, self.role)

    @property
    def served(self) -> tuple[str, ...]:
        """Every name requests may use for this backend: the model's and its adapters'."""
        return (self.model, *self.adapters)


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise RouterConfigError(f"a backend url must be http(s)://host:port, got {text!r}")
    if parts.path not in ("", "/"):
        raise RouterConfigError(f"a backend url takes no path, got {text!r}")
    return f"{parts.scheme}://{parts.netloc}"


def parse_backend(text: str) -> Backend:
    """A `--backend` flag's value."""
    fields = key_values(text, _BACKEND_KEYS, what="backend", error=RouterConfigError)
    missing = [key for key in _REQUIRED_KEYS if not fields.get(key)]
    if missing:
        raise RouterConfigError(f"backend {text!r}: missing {', '.join(missing)}")
    try:
        role = Role(fields["role"])
        engine = EngineName(fields["engine"])
    except ValueError as error:
        raise RouterConfigError(f"backend {text!r}: {error}") from error
    try:
        weight = int(fields.get("weight", "100"))
        port = int(fields.get("port", "8000"))
        context = int(fields.get("context", str(LONGEST_CONTEXT)))
        sequences = int(fields["seqs"]) if "seqs" in fields else None
    except ValueError as error:
        raise RouterConfigError(
            f"backend {text!r}: weight, port, context and seqs are integers"
        ) from error
    if weight < 0 or not 0 < port < 65536 or not 0 < context <= LONGEST_CONTEXT:
        raise RouterConfigError(
            f"backend {text!r}: weight >= 0, a port in 1..65535 and a context in "
            f"1..{LONGEST_CONTEXT}"
        )
    if sequences is not None and sequences < 1:
        raise RouterConfigError(f"backend {text!r}: seqs is at least 1")
    urls = tuple(_url(url) for url in fields.get("urls", "").split(";") if url.strip())
    service = fields.get("service") or None
    if not urls and service is None:
        raise RouterConfigError(f"backend {text!r}: give service= (Kubernetes) or urls=")
    adapters = tuple(name for name in fields.get("adapters", "").split(";") if name.strip())
    return Backend(
        fields["deployment"], role, engine, fields["model"], weight, service, port, urls, context,
        sequences, fields.get("keyfile") or None, adapters,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RouterConfig:
    service: str
    """The InferenceService: the `service` label of every series."""
    backends: tuple[Backend, ...]
    slo: Slo = field(default_factory=Slo)
    namespace: str | None = None
    discovery: DiscoveryMode = DiscoveryMode.ENDPOINT_SLICES
    max_request_bytes: int | None = None
    """Larger bodies get 413 before they are read; None: from the backends' context
    (`request_bytes_limit`)."""
    max_in_flight_requests: int = 8192
    """Requests held at once (read, queued or streaming); more get 503 with Retry-After."""
    max_in_flight_bytes: int = 128 * MIB
    """Bytes of request bodies held at once (each counted at its Content-Length, or at the
    body limit when it has none, before it is read); more get 503 with Retry-After. A request
    held costs about three times its body (the bytes read, the parsed body, the body sent
    upstream): the router's memory stays within about four times this over its idle size,
    whatever the clients send (`render.inference_service.ROUTER_MEMORY_LIMIT` holds that)."""
    idle_timeout_s: float = 75.0
    """A connection that has not sent a whole request header within this, or sits idle
    between requests, is closed. Longer than the idle timeouts of the usual load balancers in
    front (60 s), so that none reuses a connection the router has just closed."""
    body_read_timeout_s: float = 30.0
    """A body that has not arrived whole within this gets 408."""
    max_attempts: int = 3
    """Replicas tried for a request before giving up; only while nothing has been sent back."""
    retry_after_s: int = 1
    """The Retry-After of a 503 when no replica can take a request."""
    health_interval_s: float = 2.0
    upstream_connect_timeout_s: float = 5.0
    request_timeout_s: float = 600.0
    drain_delay_s: float = 5.0
    """After SIGTERM: how long the router keeps taking requests while /health says 503, so
    that endpoints stop sending it traffic before it closes its listener."""
    drain_timeout_s: float = 120.0
    """After the listener closes: how long in-flight streams may run on."""
    tenants: tuple[TenantSpec, ...] = ()
    """Who may call the service and how much (`router.tenants`); none: anyone, unlimited."""
    key_reload_s: float = 10.0
    """How often the tenants' key files are read again (a rotated Secret's new keys)."""
    max_queued_requests: int = 4096
    """Requests that may wait for the engines when they are full (`fairness.FairGate`)."""
    max_queue_wait_s: float = 30.0
    """How long a request may wait for the engines before a 503 with Retry-After."""
    wake_timeout_s: float | None = None
    """Set where the service may be at zero replicas on purpose: a request that finds no
    replica of a deployment it may go to is held up to this long for one to serve
    (`inferfleet_router_waiting_for_replicas` counts them, and `Router.on_waiting` hears each
    change), then gets 503 with Retry-After. None: 503 at once."""
    wake_config_map: str | None = None
    """The ConfigMap, in the router's namespace, that it pushes its held requests' count to
    (`render.wake`, `router.wake_push`), so that the autoscaler wakes the service at once."""
    affinity_slack_tokens: int = 8192
    """How many more outstanding tokens a replica holding a request's prefix may carry than
    the least loaded one and still be chosen for it."""

    def engine_sequences(self) -> dict[tuple[str, Role], int] | None:
        """Per serving pool (aggregated or decode), the sequences a replica batches; None when
        some pool does not say (then nothing bounds what goes to the engines)."""
        pools = {b.key: b.sequences for b in self.backends if b.role is not Role.PREFILL}
        if any(n is None for n in pools.values()):
            return None
        return {key: n for key, n in pools.items() if n is not None}

    def __post_init__(self) -> None:
        if not self.backends:
            raise RouterConfigError("the router needs at least one --backend")
        keys = [backend.key for backend in self.backends]
        if len(set(keys)) != len(keys):
            raise RouterConfigError("each deployment and role may be given once")
        for deployment in {backend.deployment for backend in self.backends}:
            roles = {b.role for b in self.backends if b.deployment == deployment}
            if roles not in ({Role.AGGREGATED}, {Role.PREFILL, Role.DECODE}):
                raise RouterConfigError(
                    f"deployment {deployment}: roles must be aggregated, or prefill and decode;"
                    f" got {', '.join(sorted(roles))}"
                )
        tenant_names = [tenant.name for tenant in self.tenants]
        if len(set(tenant_names)) != len(tenant_names):
            raise RouterConfigError("each tenant may be given once")
        limits = (
            self.max_attempts,
            self.max_request_bytes or 1,
            self.max_in_flight_requests,
            self.max_in_flight_bytes,
        )
        if self.wake_timeout_s is not None and not self.wake_timeout_s > 0:
            raise RouterConfigError("the wake timeout must be positive")
        if min(limits) < 1 or min(self.idle_timeout_s, self.body_read_timeout_s) <= 0:
            raise RouterConfigError("attempts, limits and timeouts must be positive")

    @property
    def request_bytes_limit(self) -> int:
        """`max_request_bytes`, or the longest context's worth of body bytes within
        `BODY_BYTES_RANGE`."""
        if self.max_request_bytes is not None:
            return self.max_request_bytes
        low, high = BODY_BYTES_RANGE
        return min(high, max(low, self.longest_context * BODY_BYTES_PER_CONTEXT_TOKEN))

    def deployments(self) -> list[str]:
        return sorted({backend.deployment for backend in self.backends})

    def serving(self, model: str) -> list[str]:
        """The deployments that serve `model` by that name (the base model's or an adapter's)."""
        return sorted({b.deployment for b in self.backends if model in b.served})

    def models(self) -> list[str]:
        return sorted({name for backend in self.backends for name in backend.served})

    @property
    def longest_context(self) -> int:
        """The most tokens a request can ask of any backend: prompt plus output."""
        return max(backend.context for backend in self.backends)

    def roles_of(self, deployment: str) -> list[Backend]:
        return [b for b in self.backends if b.deployment == deployment]


def parse_backends(values: Sequence[str]) -> tuple[Backend, ...]:
    return tuple(parse_backend(value) for value in values)
