"""The scheduler core of an engine emulator: vLLM's V1 scheduler, timed by the roofline model.

Pure and clock-agnostic: the caller owns time. It adds requests, calls `step(now)` and
advances its clock by the step's `duration_s`: by sleeping (the real-time emulator behind the
OpenAI API) or through an event queue (the fleet simulator). `step` decides the batch and
applies its outcome at once; the `StepResult` reports what happens at the end of the step
(`end_s`): tokens emitted, requests finished, preempted or handed off. An `idle` result means
nothing can run before the next arrival or `next_wake_s`; a request added to an idle core is
considered at the next `step`, so call it at the arrival.

What is modelled, as vLLM's V1 scheduler does it:
* continuous batching under a per-step token budget and a cap on running sequences: running
  requests first (a decode is one token, a partly prefilled prompt takes what the budget
  leaves), then waiting requests first come first served. With chunked prefill a prompt is
  split across steps; without it a prompt is scheduled only when it fits whole, and requests
  behind it may go first;
* a paged KV cache (`kv_cache.KvBlockPool`): blocks are taken as tokens are scheduled; when a
  running request finds no free block, the last request of the running list (the latest
  admitted) is preempted in recompute mode: its blocks are freed, it goes back to the front
  of the waiting queue and later prefills its prompt and emitted tokens again. No waiting
  request is admitted in a step that preempted;
* automatic prefix caching: cached leading blocks need no prefill; vLLM always computes at
  least the last token, so a hit stops one token short of the request;
* roles: `PREFILL` computes prompts and hands off their KV. `DECODE` gives a prompt its
  blocks when the waiting queue reaches it (first come first served, in steps), holds them
  while the KV crosses the link, then recomputes only the last prompt token, which samples
  the first output token;
* the first token is sampled at the end of the step that completes the prefill.

Simplified: no speculative decoding, priority scheduling, long-prefill threshold or async
scheduling. A prefill replica frees a request's blocks as soon as its prefill ends (vLLM holds
them until the decode side has read them). A decode replica schedules landed KV ahead of the
waiting queue (in vLLM it keeps its place in that queue, near the front); as they hold their
blocks already, a preempted request at the head can never block them into a deadlock. Without
chunked prefill, a resumed request longer than the budget is prefilled in chunks (vLLM never
meets this: it requires the budget to cover the model length when chunking is off).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from inferfleet.api.model_deployment import Role
from inferfleet.planning.capacity import KV_TRANSFER_BYTES_PER_S
from inferfleet.planning.memory import (
    KV_BLOCK_TOKENS,
    kv_bytes_per_token_replica,
    plan_memory,
)
from inferfleet.planning.performance import (
    DEFAULT_EFFICIENCY,
    EfficiencyTerms,
    StepLoad,
    step_time,
)
from inferfleet.planning.replica import ReplicaConfig
from inferfleet.sim.kv_cache import BlockTable, KvBlockPool, blocks_for


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request as the engine sees it: lengths, not text."""

    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    """Tokens to generate; the request finishes after emitting that many."""
    prefix_block_hashes: Sequence[int] = ()
    """Ids of the prompt's consecutive blocks of `hash_block_tokens` tokens, chained: equal ids
    at equal positions mean equal tokens (as in the Mooncake traces, 512 tokens per id)."""
    hash_block_tokens: int = KV_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.max_output_tokens < 1 or self.hash_block_tokens < 1:
            raise ValueError(
                f"request {self.request_id}: prompt_tokens, max_output_tokens and "
                f"hash_block_tokens must be >= 1 (got {self.prompt_tokens}, "
                f"{self.max_output_tokens}, {self.hash_block_tokens})"
            )


class RequestRejectedError(ValueError):
    """The engine can never serve the request (vLLM answers such requests with HTTP 400)."""


@dataclass(frozen=True, slots=True)
class KvHandoff:
    """A prefill replica finished a prompt: its KV leaves for a decode replica."""

    request_id: str
    prompt_tokens: int
    kv_bytes: int


class EventKind(Enum):
    """What happened to a request at the end of a step."""

    PREEMPTED = "preempted"
    FIRST_TOKEN = "first_token"
    TOKEN = "token"
    FINISHED = "finished"
    PREFILL_COMPLETE = "prefill_complete"


@dataclass(frozen=True, slots=True)
class EngineEvent:
    """One request's outcome of a step, for callers that want a flat stream."""

    kind: EventKind
    request_id: str
    time_s: float
    kv_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StepResult:
    """One engine step: when it started, how long it ran, the work in it and its outcome.

    Lists hold request ids in batch order. `tokens` has one entry per token emitted at the end
    of the step, first tokens included; `first_tokens` and `finished` are subsets of it.
    """

    start_s: float
    duration_s: float
    load: StepLoad
    sequences: int
    """Requests in the batch (decodes and prefill chunks)."""
    started: list[str] = field(default_factory=list)
    """Requests scheduled for the first time, at `start_s` (their queueing time ends)."""
    tokens: list[str] = field(default_factory=list)
    first_tokens: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    """Requests sent back to the queue (at `start_s`); their emitted tokens stand."""
    handoffs: list[KvHandoff] = field(default_factory=list)

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    @property
    def idle(self) -> bool:
        """Nothing could run: wait for an arrival or `EngineCore.next_wake_s`."""
        return self.sequences == 0

    def events(self) -> Iterator[EngineEvent]:
        """The outcome as events at `end_s`: preemptions, tokens, finishes, hand-offs."""
        end = self.end_s
        first = set(self.first_tokens)
        for request_id in self.preempted:
            yield EngineEvent(EventKind.PREEMPTED, request_id, end)
        for request_id in self.tokens:
            kind = EventKind.FIRST_TOKEN if request_id in first else EventKind.TOKEN
            yield EngineEvent(kind, request_id, end)
        for request_id in self.finished:
            yield EngineEvent(EventKind.FINISHED, request_id, end)
        for handoff in self.handoffs:
            yield EngineEvent(
                EventKind.PREFILL_COMPLETE, handoff.request_id, end, kv_bytes=handoff.kv_bytes
            )


@dataclass(frozen=True, slots=True)
class EngineStats:
    """What the engine's Prometheus metrics report; each field names its vLLM metric."""

    running: int
    """`vllm:num_requests_running`."""
    waiting: int
    """`vllm:num_requests_waiting`: queued requests, those whose KV is still arriving too."""
    kv_usage: float
    """`vllm:kv_cache_usage_perc` (a fraction): blocks held by requests; cached blocks that
    nobody holds count as free."""
    prefix_cache_queries: int
    """`vllm:prefix_cache_queries_total`, in tokens. Resumed requests are left out, as vLLM
    counts them apart."""
    prefix_cache_hits: int
    """`vllm:prefix_cache_hits_total`, in tokens."""
    preemptions: int
    """`vllm:num_preemptions_total`."""
    prompt_tokens: int
    """`vllm:prompt_tokens_total`: counted when a request gets its first token (or hands off)."""
    generation_tokens: int
    """`vllm:generation_tokens_total`."""
    steps: int
    busy_s: float
    """Seconds spent in steps (engine utilisation is its rate)."""


class _State(Enum):
    WAITING = "waiting"
    TRANSFERRING = "transferring"
    """Decode role: blocks held, the KV on its way."""
    LANDED = "landed"
    """Decode role: the KV arrived; ready for its first decode."""
    RUNNING = "running"
    DONE = "done"


class _Sequence:
    """A request's progress inside the engine."""

    __slots__ = (
        "computed",
        "max_output",
        "output",
        "preemptions",
        "prompt",
        "ready_s",
        "remote_kv",
        "request_id",
        "started",
        "state",
        "table",
        "tokens",
    )

    def __init__(self, request: EngineRequest, table: BlockTable, remote_kv: bool) -> None:
        self.request_id = request.request_id
        self.prompt = request.prompt_tokens
        self.max_output = request.max_output_tokens
        self.table = table
        self.computed = 0
        """Tokens whose KV is in the cache."""
        self.output = 0
        """Tokens emitted; the last one is not yet computed."""
        self.tokens = self.prompt
        """Tokens whose KV the next sample needs: the prompt and every emitted token."""
        self.preemptions = 0
        self.started = False
        self.remote_kv = remote_kv
        """The prompt's KV comes from a prefill replica (until it has landed)."""
        self.ready_s = 0.0
        """Decode role: when the KV transfer lands."""
        self.state = _State.WAITING


class EngineCore:
    """vLLM's scheduler for one replica, with step times from the planner's roofline model."""

    def __init__(
        self,
        config: ReplicaConfig,
        role: Role = Role.AGGREGATED,
        *,
        efficiency: EfficiencyTerms = DEFAULT_EFFICIENCY,
        prefix_caching: bool = True,
        kv_transfer_bytes_per_s: float | None = None,
        kv_capacity_blocks: int | None = None,
    ) -> None:
        """`kv_transfer_bytes_per_s` is the prefill-to-decode link of the whole replica: by
        default one `KV_TRANSFER_BYTES_PER_S` NIC per GPU, each GPU moving its own shard, which
        gives the planner's transfer time. `kv_capacity_blocks` overrides the memory plan."""
        self.config = config
        self.role = role
        self.efficiency = efficiency
        blocks = kv_capacity_blocks
        if blocks is None:
            blocks = plan_memory(config).kv_capacity_tokens // KV_BLOCK_TOKENS
        if blocks < 1:
            raise ValueError("the replica has no room for a KV cache (see plan_memory)")
        self._pool = KvBlockPool(blocks, prefix_caching=prefix_caching)
        self._kv_bytes_per_token = kv_bytes_per_token_replica(config)
        self._transfer_bytes_per_s = kv_transfer_bytes_per_s or (
            KV_TRANSFER_BYTES_PER_S * config.gpus
        )
        self._budget = config.max_batched_tokens
        self._max_sequences = config.max_sequences
        self._chunked = config.chunked_prefill
        self._context_limit = config.context_limit

        self._live: dict[str, _Sequence] = {}
        self._running: list[_Sequence] = []
        self._waiting: deque[_Sequence] = deque()
        self._transfers: list[tuple[float, int, _Sequence]] = []
        self._landed: deque[_Sequence] = deque()
        self._transfers_started = 0

        self._prefix_cache_queries = 0
        self._prefix_cache_hits = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._steps = 0
        self._busy_s = 0.0

    # Read-only state for metrics.

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Queued requests, those waiting for their KV included (as vLLM counts them)."""
        return len(self._live) - len(self._running)

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks held by requests; cached free blocks count as free."""
        return self._pool.usage

    @property
    def kv_capacity_blocks(self) -> int:
        return self._pool.total_blocks

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self._running),
            waiting=self.num_waiting,
            kv_usage=self._pool.usage,
            prefix_cache_queries=self._prefix_cache_queries,
            prefix_cache_hits=self._prefix_cache_hits,
            preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            steps=self._steps,
            busy_s=self._busy_s,
        )

    @property
    def has_work(self) -> bool:
        return bool(self._live)

    @property
    def next_wake_s(self) -> float | None:
        """When the earliest KV transfer lands: an idle decode replica's next step without a
        new arrival. None when no transfer is under way."""
        while self._transfers and self._transfers[0][2].state is not _State.TRANSFERRING:
            heapq.heappop(self._transfers)
        return self._transfers[0][0] if self._transfers else None

    # Requests in and out.

    def add_request(self, request: EngineRequest) -> None:
        """Queue `request`; `RequestRejectedError` if it can never run.

        It is considered at the next `step`: on an idle core, call `step` at its arrival."""
        if request.request_id in self._live:
            raise ValueError(f"request {request.request_id} is already in the engine")
        self._check_admissible(request)
        table = self._pool.new_table(
            request.prompt_tokens, request.prefix_block_hashes, request.hash_block_tokens
        )
        sequence = _Sequence(request, table, remote_kv=self.role is Role.DECODE)
        self._live[request.request_id] = sequence
        self._waiting.append(sequence)

    def _check_admissible(self, request: EngineRequest) -> None:
        prompt, output = request.prompt_tokens, request.max_output_tokens
        if prompt + output > self._context_limit:
            raise RequestRejectedError(
                f"request {request.request_id}: {prompt} prompt + {output} output tokens exceed "
                f"the maximum model length {self._context_limit}"
            )
        held = prompt if self.role is Role.PREFILL else prompt + output
        if blocks_for(held) > self._pool.total_blocks:
            raise RequestRejectedError(
                f"request {request.request_id}: {held} tokens exceed the KV cache of "
                f"{self._pool.total_blocks * KV_BLOCK_TOKENS} tokens"
            )
        if not self._chunked and self.role is not Role.DECODE and prompt > self._budget:
            raise RequestRejectedError(
                f"request {request.request_id}: a {prompt}-token prompt never fits the step "
                f"budget of {self._budget} tokens without chunked prefill"
            )

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is and free its blocks; False if unknown or done.

        Events of the step in flight may still name it: callers ignore them."""
        sequence = self._live.pop(request_id, None)
        if sequence is None:
            return False
        if sequence.state is _State.RUNNING:
            self._running.remove(sequence)
        elif sequence.state is _State.WAITING:
            self._waiting.remove(sequence)
        elif sequence.state is _State.LANDED:
            self._landed.remove(sequence)
        # A transfer stays in the heap and is skipped when it comes up.
        sequence.state = _State.DONE
        self._pool.free(sequence.table)
        return True

    # Decode role: KV arriving from prefill replicas.

    def _start_transfer(self, sequence: _Sequence, now: float) -> bool:
        """Give a remote prompt its blocks and start pulling its KV; False if blocks are short.

        Blocks the decode replica already caches (a shared prefix) are not sent again."""
        hits = self._lookup(sequence)
        if not self._pool.admit(sequence.table, hits, sequence.prompt):
            return False
        self._count_query(sequence, len(hits))
        sent_tokens = sequence.prompt - len(hits) * KV_BLOCK_TOKENS
        sequence.ready_s = now + sent_tokens * self._kv_bytes_per_token / self._transfer_bytes_per_s
        sequence.state = _State.TRANSFERRING
        self._transfers_started += 1
        heapq.heappush(self._transfers, (sequence.ready_s, self._transfers_started, sequence))
        return True

    def _land_transfers(self, now: float) -> None:
        """Transfers done by `now` hold all but the last prompt token: the first decode step
        recomputes it and samples the first token (as vLLM's KV connectors leave it)."""
        transfers = self._transfers
        while transfers and transfers[0][0] <= now:
            _, _, sequence = heapq.heappop(transfers)
            if sequence.state is not _State.TRANSFERRING:
                continue
            sequence.computed = sequence.prompt - 1
            sequence.remote_kv = False
            self._pool.cache_full_blocks(sequence.table, sequence.computed)
            sequence.state = _State.LANDED
            self._landed.append(sequence)

    # Scheduling.

    def _lookup(self, sequence: _Sequence) -> list[int]:
        """Cached leading blocks of a request with nothing computed. vLLM always computes the
        last token (its logits give the next one), so a hit stops short of it."""
        return self._pool.cached_prefix(sequence.table, (sequence.tokens - 1) // KV_BLOCK_TOKENS)

    def _count_query(self, sequence: _Sequence, hit_blocks: int) -> None:
        """Count a first admission's prefix-cache lookup (resumed requests are not counted)."""
        if self._pool.prefix_caching and sequence.preemptions == 0:
            self._prefix_cache_queries += sequence.tokens
            self._prefix_cache_hits += hit_blocks * KV_BLOCK_TOKENS

    def _preempt(self, sequence: _Sequence) -> None:
        """Recompute mode: drop the KV, keep the emitted tokens, requeue at the front."""
        self._pool.free(sequence.table)
        sequence.computed = 0
        sequence.preemptions += 1
        sequence.state = _State.WAITING
        self._waiting.appendleft(sequence)
        self._preemptions += 1

    def _start_running(self, sequence: _Sequence, started: list[str]) -> None:
        sequence.state = _State.RUNNING
        self._running.append(sequence)
        if not sequence.started:
            sequence.started = True
            started.append(sequence.request_id)

    def step(self, now: float) -> StepResult:
        """Run one engine step starting at `now`; its outcome lands at `now + duration_s`."""
        if self._transfers:
            self._land_transfers(now)
        pool = self._pool
        budget = self._budget
        running = self._running
        batch: list[tuple[_Sequence, int]] = []
        preempted: list[str] = []
        started: list[str] = []

        # Running requests first: decodes and the next chunk of partly prefilled prompts.
        index = 0
        while index < len(running) and budget > 0:
            sequence = running[index]
            tokens = min(sequence.tokens - sequence.computed, budget)
            needed = sequence.computed + tokens
            if needed > sequence.table.blocks * KV_BLOCK_TOKENS:
                # No free block: preempt from the back of the running list, this one included.
                while not pool.grow(sequence.table, needed):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted.append(victim.request_id)
                    if victim is sequence:
                        break
            if sequence.state is not _State.RUNNING:
                break
            batch.append((sequence, tokens))
            budget -= tokens
            index += 1

        # Then queued requests, unless this step had to preempt. When the running list
        # preempted itself empty there is no step to run; vLLM's next schedule call, an instant
        # later, would admit from the queues, so that is done here.
        if not preempted or not batch:
            max_sequences = self._max_sequences
            # Decode role: prompts whose KV has landed hold their blocks; they need one token.
            landed = self._landed
            while landed and budget > 0 and len(running) < max_sequences:
                sequence = landed.popleft()
                tokens = sequence.tokens - sequence.computed
                self._start_running(sequence, started)
                batch.append((sequence, tokens))
                budget -= tokens

            # Waiting requests, first come first served.
            skipped: list[_Sequence] = []
            waiting = self._waiting
            while waiting and budget > 0 and len(running) < max_sequences:
                sequence = waiting[0]
                if sequence.remote_kv:
                    # Blocks now, the first decode once the KV is here; no budget used.
                    if not self._start_transfer(sequence, now):
                        break
                    waiting.popleft()
                    continue
                hits = self._lookup(sequence)
                start = len(hits) * KV_BLOCK_TOKENS
                tokens = sequence.tokens - start
                if not self._chunked and budget < tokens <= self._budget:
                    skipped.append(waiting.popleft())  # whole or not at all; others may pass
                    continue
                tokens = min(tokens, budget)
                if not pool.admit(sequence.table, hits, start + tokens):
                    break
                waiting.popleft()
                self._count_query(sequence, len(hits))
                sequence.computed = start
                self._start_running(sequence, started)
                batch.append((sequence, tokens))
                budget -= tokens
            waiting.extendleft(reversed(skipped))

        if not batch:
            return StepResult(now, 0.0, StepLoad(), 0, preempted=preempted)
        return self._run(now, batch, started, preempted)

    def _run(
        self,
        now: float,
        batch: list[tuple[_Sequence, int]],
        started: list[str],
        preempted: list[str],
    ) -> StepResult:
        """Time the batch with the roofline model, then apply what it computed and sampled."""
        decodes = decode_context = prefill = 0
        pairs = 0.0
        for sequence, tokens in batch:
            start = sequence.computed
            if tokens == 1 and start > 0 and start + 1 == sequence.tokens:
                decodes += 1
                decode_context += start + 1
            else:
                prefill += tokens
                pairs += tokens * (start + tokens / 2)
        load = StepLoad(
            decode_sequences=decodes,
            decode_context_tokens=decode_context,
            prefill_tokens=prefill,
            prefill_attention_pairs=pairs,
        )
        duration = step_time(self.config, load, self.efficiency).total_s
        self._steps += 1
        self._busy_s += duration
        result = StepResult(now, duration, load, len(batch), started, preempted=preempted)

        pool = self._pool
        caching = pool.prefix_caching
        prefill_role = self.role is Role.PREFILL
        any_done = False
        for sequence, tokens in batch:
            computed = sequence.computed + tokens
            sequence.computed = computed
            if caching and computed >= (sequence.table.registered + 1) * KV_BLOCK_TOKENS:
                pool.cache_full_blocks(sequence.table, computed)
            if computed < sequence.tokens:
                continue  # a prefill chunk: nothing sampled yet
            request_id = sequence.request_id
            if prefill_role:
                result.handoffs.append(
                    KvHandoff(
                        request_id, sequence.prompt, sequence.prompt * self._kv_bytes_per_token
                    )
                )
                self._prompt_tokens += sequence.prompt
                self._finish(sequence)
                any_done = True
                continue
            sequence.output += 1
            sequence.tokens += 1
            self._generation_tokens += 1
            result.tokens.append(request_id)
            if sequence.output == 1:
                result.first_tokens.append(request_id)
                self._prompt_tokens += sequence.prompt
            if sequence.output >= sequence.max_output:
                result.finished.append(request_id)
                self._finish(sequence)
                any_done = True
        if any_done:
            self._running = [s for s in self._running if s.state is _State.RUNNING]
        return result

    def _finish(self, sequence: _Sequence) -> None:
        sequence.state = _State.DONE
        self._pool.free(sequence.table)
        del self._live[sequence.request_id]
