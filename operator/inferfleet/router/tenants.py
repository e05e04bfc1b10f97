"""The tenants of one service at its router: who sends a request (an API key of theirs), and
whether it may run now. Pure: keys come in as text, time as an argument.

A tenant is given as comma-separated `key=value` pairs, as `--tenant` takes them:

    name=team-a,keys=/etc/inferfleet/tenants/team-a,rps=20,tpm=200000,concurrency=32,
    models=llama-3.1-8b;llama-tuned

`keys` names a directory whose regular files each hold one key (a Kubernetes Secret mounted
as a volume: every value of the Secret is a key the tenant may use, so a key is rotated by
adding the new one, moving clients over and deleting the old). The router keeps only their
SHA-256 digests and reads the directory again as it changes, without a restart.

Limits, each optional: `rps` requests a second and `tpm` tokens a minute (token buckets that
hold one second's and one minute's worth: a burst up to that passes at once), `concurrency`
requests at once. A request is charged its prompt estimate plus its `max_tokens` (as the
OpenAI API counts a rate limit) when it is admitted, and what it did not use is given back when
it ends. Over a limit: 429 with the seconds until the request would pass (`Retry-After`).
`models` limits the served model names the tenant may ask for (403 for another; all when not
given).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from inferfleet.router.fairness import Priority
from inferfleet.router.flags import key_values

_TENANT_KEYS = ("name", "keys", "rps", "tpm", "concurrency", "models", "priority")


class TenantConfigError(ValueError):
    """A `--tenant` flag that cannot be used, with what is wrong."""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    keys: str
    """Directory of key files (a mounted Secret)."""
    requests_per_s: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent: int | None = None
    models: tuple[str, ...] = ()
    """Served model names the tenant may use; empty: every one."""
    priority: Priority = Priority.INTERACTIVE
    """When the engines are full: interactive requests wait ahead of batch ones."""


def parse_tenant(text: str) -> TenantSpec:
    """A `--tenant` flag's value."""
    fields = key_values(text, _TENANT_KEYS, what="tenant", error=TenantConfigError)
    if not fields.get("name") or not fields.get("keys"):
        raise TenantConfigError(f"tenant {text!r}: name= and keys= are required")
    try:
        rps = float(fields["rps"]) if "rps" in fields else None
        tpm = float(fields["tpm"]) if "tpm" in fields else None
        concurrency = int(fields["concurrency"]) if "concurrency" in fields else None
    except ValueError as error:
        raise TenantConfigError(f"tenant {text!r}: rps, tpm and concurrency are numbers") from error
    limits = [v for v in (rps, tpm, concurrency) if v is not None]
    if any(not math.isfinite(v) or v <= 0 for v in limits):
        raise TenantConfigError(f"tenant {text!r}: limits must be positive")
    models = tuple(m for m in fields.get("models", "").split(";") if m)
    try:
        priority = Priority(fields.get("priority", Priority.INTERACTIVE.value))
    except ValueError:
        raise TenantConfigError(
            f"tenant {text!r}: priority is {' or '.join(p.value for p in Priority)}"
        ) from None
    return TenantSpec(fields["name"], fields["keys"], rps, tpm, concurrency, models, priority)


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """API keys -> tenant, kept as SHA-256 digests only."""

    def __init__(self) -> None:
        self._tenant_of: dict[bytes, str] = {}

    def replace(self, tenant: str, keys: Iterable[str]) -> None:
        """The tenant's keys are now `keys` (blank ones ignored); its others stop working."""
        kept = {d: t for d, t in self._tenant_of.items() if t != tenant}
        for key in keys:
            if key.strip():
                kept[key_digest(key.strip())] = tenant
        self._tenant_of = kept

    def tenant_of(self, key: str) -> str | None:
        return self._tenant_of.get(key_digest(key))

    def __len__(self) -> int:
        return len(self._tenant_of)


@dataclass(slots=True)
class TokenBucket:
    """`rate` a second, holding at most `capacity`; starts full."""

    rate: float
    capacity: float
    level: float = math.nan
    at: float = math.nan

    def _fill(self, now: float) -> None:
        if math.isnan(self.level):
            self.level, self.at = self.capacity, now
        self.level = min(self.capacity, self.level + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)

    def take(self, amount: float, now: float) -> float:
        """Take `amount` and return 0, or take nothing and return the seconds until it could
        be taken. More than the bucket holds is taken from a full bucket (it goes into debt),
        so a request larger than one period's worth is slowed, never refused for good."""
        self._fill(now)
        if amount <= self.level or self.level >= self.capacity:
            self.level -= amount
            return 0.0
        return (min(amount, self.capacity) - self.level) / self.rate

    def give_back(self, amount: float, now: float) -> None:
        self._fill(now)
        self.level = min(self.capacity, self.level + max(0.0, amount))


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    message: str
    kind: str
    retry_after_s: float | None = None


@dataclass(slots=True)
class _TenantState:
    spec: TenantSpec
    requests: TokenBucket | None
    tokens: TokenBucket | None
    running: int = 0


@dataclass(slots=True)
class Tenants:
    """Who may call the service and how much; empty: anyone, unlimited (no tenants given)."""

    specs: Sequence[TenantSpec]
    keys: KeyRing = field(default_factory=KeyRing)
    _state: dict[str, _TenantState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [spec.name for spec in self.specs]
        if len(set(names)) != len(names):
            raise TenantConfigError("each tenant may be given once")
        for spec in self.specs:
            self._state[spec.name] = _TenantState(
                spec,
                None
                if spec.requests_per_s is None
                else TokenBucket(spec.requests_per_s, max(1.0, spec.requests_per_s)),
                None
                if spec.tokens_per_minute is None
                else TokenBucket(spec.tokens_per_minute / 60, spec.tokens_per_minute),
            )

    @property
    def enforced(self) -> bool:
        return bool(self.specs)

    def authenticate(self, headers: Mapping[str, str]) -> str | Refusal:
        """The tenant whose key the `Authorization: Bearer` header carries."""
        scheme, _, key = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return Refusal(
                401, "no API key: send it as `Authorization: Bearer <key>`", "AuthenticationError"
            )
        tenant = self.keys.tenant_of(key.strip())
        if tenant is None:
            return Refusal(401, "the API key is not valid for this service", "AuthenticationError")
        return tenant

    def admit(self, tenant: str, now: float) -> Refusal | None:
        """One more request of `tenant` now, within its requests a second and at once; None:
        admitted (`end` it)."""
        state = self._state[tenant]
        spec = state.spec
        if spec.max_concurrent is not None and state.running >= spec.max_concurrent:
            return Refusal(
                429,
                f"tenant {tenant} has {spec.max_concurrent} requests running, its limit",
                "RateLimitError",
                1.0,
            )
        if state.requests is not None:
            wait = state.requests.take(1.0, now)
            if wait > 0:
                return Refusal(
                    429,
                    f"tenant {tenant} is over its {spec.requests_per_s:g} requests a second",
                    "RateLimitError",
                    wait,
                )
        state.running += 1
        return None

    def priority(self, tenant: str | None) -> Priority:
        """The tenant's priority class; anonymous requests (no tenants) are interactive."""
        return Priority.INTERACTIVE if tenant is None else self._state[tenant].spec.priority

    def may_use(self, tenant: str, model: str | None) -> Refusal | None:
        allowed = self._state[tenant].spec.models
        if model is None or not allowed or model in allowed:
            return None
        return Refusal(
            403,
            f"tenant {tenant} may not use the model {model!r} (allowed: {', '.join(allowed)})",
            "PermissionDeniedError",
        )

    def charge(self, tenant: str, tokens: int, now: float) -> Refusal | None:
        """The tokens a request may use, within the tenant's tokens a minute; None: charged."""
        bucket = self._state[tenant].tokens
        if bucket is None:
            return None
        wait = bucket.take(tokens, now)
        if wait <= 0:
            return None
        per_minute = self._state[tenant].spec.tokens_per_minute
        return Refusal(
            429,
            f"tenant {tenant} is over its {per_minute:g} tokens a minute ({tokens} asked)",
            "RateLimitError",
            wait,
        )

    def refund(self, tenant: str, tokens: int, now: float) -> None:
        """Tokens charged that the request did not use."""
        bucket = self._state[tenant].tokens
        if bucket is not None and tokens > 0:
            bucket.give_back(tokens, now)

    def end(self, tenant: str) -> None:
        """A request admitted for `tenant` ended."""
        state = self._state[tenant]
        state.running = max(0, state.running - 1)
