"""Choosing a replica for a request. Pure: no I/O, no clock.

A request first goes to a deployment (smooth weighted round robin over the deployments whose
roles all have a healthy replica, by their `weight`), then to a replica of each role it needs
(aggregated; or prefill, then decode):
* load is the outstanding tokens a replica still has to process for the requests the router
  sent it (prompt tokens until the first token comes back, then the output tokens still to
  come), the signal vLLM's own production router and llm-d's scorers use: it sees a long
  prompt as the work it is, where counting requests does not;
* prefix affinity: the router remembers which replica served which prompt prefix (chained
  block hashes, as the engine's prefix cache keys them). Among replicas within
  `slack_tokens` of the least loaded, it picks the one holding the longest prefix of the
  request; otherwise the least loaded. Ties go round robin.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from inferfleet.api.model_deployment import Role
from inferfleet.router.requests import PREFIX_BLOCKS


@dataclass(eq=False, slots=True)
class Replica:
    """One engine replica as the router sees it."""

    url: str
    deployment: str
    role: Role
    healthy: bool = False
    """Set by health checks; a replica starts unhealthy until its first check passes."""
    outstanding_tokens: int = 0
    in_flight: int = 0
    served: int = 0


@dataclass(slots=True)
class PrefixIndex:
    """Which replicas recently served each prompt prefix: chained block hash -> replica urls,
    least recently used first out."""

    capacity: int = 200_000
    max_blocks: int = PREFIX_BLOCKS
    """Blocks of a prompt looked at: past it, a longer match rarely changes the choice."""
    _entries: OrderedDict[int, set[str]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def matches(self, blocks: Sequence[int], urls: Iterable[str]) -> dict[str, int]:
        """Leading blocks of `blocks` each replica in `urls` is known to hold."""
        alive = set(urls)
        matched = dict.fromkeys(alive, 0)
        for depth, block in enumerate(blocks[: self.max_blocks], start=1):
            holders = self._entries.get(block)
            if not holders:
                break
            alive &= holders
            if not alive:
                break
            for url in alive:
                matched[url] = depth
        return matched

    def record(self, blocks: Sequence[int], url: str) -> int:
        """Record that `url` now holds `blocks`; the leading blocks some replica held before
        (what a prefix cache that every replica shared could have served)."""
        entries = self._entries
        seen = 0
        leading = True
        for block in blocks[: self.max_blocks]:
            holders = entries.get(block)
            if holders is None:
                entries[block] = {url}
                leading = False
            else:
                seen += leading
                holders.add(url)
                entries.move_to_end(block)
        while len(entries) > self.capacity:
            entries.popitem(last=False)
        return seen

    def forget(self, url: str) -> None:
        """A replica went away: its cache went with it."""
        for block in [block for block, holders in self._entries.items() if url in holders]:
            holders = self._entries[block]
            holders.discard(url)
            if not holders:
                del self._entries[block]


class Balancer:
    """The replicas of one service and the choice among them."""

    def __init__(
        self, weights: dict[str, int], *, slack_tokens: int = 8192, prefix_capacity: int = 200_000
    ) -> None:
        self.weights = dict(weights)
        """Deployment -> weight."""
        self.slack_tokens = slack_tokens
        self.replicas: dict[tuple[str, Role], dict[str, Replica]] = {}
        self.prefixes: dict[tuple[str, Role], PrefixIndex] = {}
        self._prefix_capacity = prefix_capacity
        self._current_weight = dict.fromkeys(weights, 0)
        self._turn = 0

    def roles_of(self, deployment: str) -> list[Role]:
        return sorted(
            (role for (name, role) in self.replicas if name == deployment),
            key=lambda role: 0 if role is Role.PREFILL else 1,
        )

    def declare(self, deployment: str, role: Role) -> None:
        """A role the service routes to, with no replica known yet."""
        self.replicas.setdefault((deployment, role), {})
        self.prefixes.setdefault((deployment, role), PrefixIndex(capacity=self._prefix_capacity))

    def set_replicas(self, deployment: str, role: Role, urls: Iterable[str]) -> list[Replica]:
        """The replicas discovery lists now. Known ones keep their state; new ones start
        unhealthy (and are returned, to be checked); gone ones are dropped."""
        self.declare(deployment, role)
        known = self.replicas[(deployment, role)]
        wanted = set(urls)
        for url in [url for url in known if url not in wanted]:
            del known[url]
            self.prefixes[(deployment, role)].forget(url)
        added = []
        for url in sorted(wanted - known.keys()):
            replica = Replica(url, deployment, role)
            known[url] = replica
            added.append(replica)
        return added

    def all_replicas(self) -> list[Replica]:
        return [replica for pool in self.replicas.values() for replica in pool.values()]

    def routable(self, deployment: str) -> bool:
        roles = self.roles_of(deployment)
        return bool(roles) and all(
            any(r.healthy for r in self.replicas[(deployment, role)].values()) for role in roles
        )

    def choose_deployment(self, among: Collection[str] | None = None) -> str | None:
        """Smooth weighted round robin (nginx's) over the routable deployments (of `among`,
        when given: those serving the model a request names)."""
        candidates = [
            name
            for name in sorted(self.weights)
            if self.weights[name] > 0 and (among is None or name in among) and self.routable(name)
        ]
        if not candidates:
            return None
        total = 0
        best: str | None = None
        for name in candidates:
            self._current_weight[name] = self._current_weight.get(name, 0) + self.weights[name]
            total += self.weights[name]
            if best is None or self._current_weight[name] > self._current_weight[best]:
                best = name
        assert best is not None
        self._current_weight[best] -= total
        return best

    def choose(
        self,
        deployment: str,
        role: Role,
        prefix_blocks: Sequence[int] = (),
        exclude: Iterable[str] = (),
    ) -> Replica | None:
        """The replica of a role to send a request to; None when no healthy one is left."""
        excluded = set(exclude)
        pool = self.replicas.get((deployment, role), {})
        candidates = [r for r in pool.values() if r.healthy and r.url not in excluded]
        if not candidates:
            return None
        least = min(r.outstanding_tokens for r in candidates)
        within = [r for r in candidates if r.outstanding_tokens <= least + self.slack_tokens]
        matched = (
            self.prefixes[(deployment, role)].matches(prefix_blocks, (r.url for r in within))
            if prefix_blocks
            else {}
        )
        best_match = max(matched.values(), default=0)
        if best_match > 0:
            pick = [r for r in within if matched[r.url] == best_match]
        else:
            pick = [r for r in candidates if r.outstanding_tokens == least]
        lowest = min(r.outstanding_tokens for r in pick)
        pick = [r for r in pick if r.outstanding_tokens == lowest]
        self._turn += 1
        return pick[self._turn % len(pick)]

    def record_prefix(self, replica: Replica, prefix_blocks: Sequence[int]) -> tuple[int, int]:
        """Record the prompt's blocks for affinity; the blocks looked at, and how many of them
        lead a prompt this pool was sent recently (`PrefixIndex.record`)."""
        if not prefix_blocks:
            return 0, 0
        index = self.prefixes[(replica.deployment, replica.role)]
        seen = index.record(prefix_blocks, replica.url)
        return min(len(prefix_blocks), index.max_blocks), seen
