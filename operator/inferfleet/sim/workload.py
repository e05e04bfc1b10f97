"""The unit of load: one request of an open-loop schedule, as the fleet simulator replays it and
the load generator (`inferfleet.bench`) sends it. Traces and synthetic patterns that build
schedules live in `inferfleet.bench.traces`, above the simulator."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HASH_BLOCK_TOKENS = 512
"""Tokens per prefix-hash block in the Mooncake traces."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a schedule: when it is sent and how long it is."""

    arrival_s: float
    """Seconds from the start of the schedule."""
    input_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...] = ()
    """Ids of the prompt's consecutive blocks of `hash_block_tokens` tokens (empty: unknown,
    taken as unique to the request)."""
    hash_block_tokens: int = DEFAULT_HASH_BLOCK_TOKENS
