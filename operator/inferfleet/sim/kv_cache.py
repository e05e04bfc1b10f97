"""A paged KV cache with automatic prefix caching, as vLLM's V1 `KVCacheManager` keeps it.

Only counts and block identities are modelled, never contents. A block holds
`KV_BLOCK_TOKENS` tokens. A full block is identified by a key that stands for the block's tokens
and everything before them (vLLM's chained block hash), so two requests with the same key at
the same position hold the same KV and can share the block.

Keys are ints, cheap to hash:
* shared keys, for prompt blocks whose tokens a request's `prefix_block_hashes` describe:
  `(chain id << 32) | block index`, where the chain id interns the prefix of hash ids up to
  the hash block the block ends in;
* private keys, for blocks no other request can share (prompts without hashes, generated
  tokens): negative, from a per-request id. A preempted request still finds its own blocks on
  resume while they stay cached, as in vLLM.

Freed blocks keep their key and stay cached until their space is needed (least recently freed
first, and a request's tail blocks before its head, as vLLM frees in reverse order). One
simplification: vLLM takes new blocks from a single free queue in which never-cached and cached
blocks mix in the order they were freed; here blocks without a key are always used first, so
cached prefixes live a little longer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from inferfleet.planning.memory import KV_BLOCK_TOKENS

BlockKey = int

_INDEX_BITS = 32
_NO_CHAIN = -1


def blocks_for(tokens: int) -> int:
    """Blocks that hold `tokens` tokens."""
    return -(-tokens // KV_BLOCK_TOKENS)


class BlockTable:
    """The blocks one request holds and the keys its full blocks have."""

    __slots__ = ("anonymous", "blocks", "keys", "private_id", "registered", "shared_keys")

    def __init__(self, shared_keys: list[BlockKey], private_id: int) -> None:
        self.shared_keys = shared_keys
        """Keys of the leading prompt blocks that the request's prefix hashes describe."""
        self.private_id = private_id
        self.keys: list[BlockKey] = []
        """Keys of the held blocks that are in the cache (and counted in its references)."""
        self.anonymous = 0
        """Held blocks without a cache entry: partly filled, or a duplicate of a cached block."""
        self.registered = 0
        """Leading blocks already offered to the cache."""
        self.blocks = 0
        """Blocks held: len(keys) + anonymous, kept as a field for the scheduler's hot path."""

    def key(self, index: int) -> BlockKey:
        if index < len(self.shared_keys):
            return self.shared_keys[index]
        return -((self.private_id << _INDEX_BITS) | index) - 1


class KvBlockPool:
    """Block accounting for one replica: free blocks, cached blocks and their references."""

    def __init__(self, total_blocks: int, *, prefix_caching: bool = True) -> None:
        if total_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block (got {total_blocks})")
        self.total_blocks = total_blocks
        self.prefix_caching = prefix_caching
        self._never_cached = total_blocks
        """Free blocks with no key: used first."""
        self._references: dict[BlockKey, int] = {}
        """Every cached block: how many running requests hold it (0: free but still cached)."""
        self._evictable: OrderedDict[BlockKey, None] = OrderedDict()
        """Cached blocks nobody holds, least recently freed first."""
        self._chains: dict[tuple[int, int], int] = {}
        self._next_private_id = 0

    @property
    def free_blocks(self) -> int:
        """Blocks a request can take, cached-but-unused ones included (as vLLM counts them)."""
        return self._never_cached + len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's `kv_cache_usage_perc`)."""
        return 1.0 - self.free_blocks / self.total_blocks

    def new_table(
        self, prompt_tokens: int, prefix_block_hashes: Sequence[int], hash_block_tokens: int
    ) -> BlockTable:
        """A request's empty block table, with the keys its prefix hashes give its prompt."""
        self._next_private_id += 1
        shared: list[BlockKey] = []
        if self.prefix_caching and prefix_block_hashes:
            shared = self._shared_keys(prompt_tokens, prefix_block_hashes, hash_block_tokens)
        return BlockTable(shared, self._next_private_id)

    def _shared_keys(
        self, prompt_tokens: int, hashes: Sequence[int], hash_block_tokens: int
    ) -> list[BlockKey]:
        """Keys of the full prompt blocks that lie inside the hashed span.

        A block's key chains every hash up to the hash block holding its last token, so blocks
        match only when all the tokens before them match too.
        """
        keys: list[BlockKey] = []
        chain = _NO_CHAIN
        chained = -1
        for index in range(prompt_tokens // KV_BLOCK_TOKENS):
            hash_index = (index * KV_BLOCK_TOKENS + KV_BLOCK_TOKENS - 1) // hash_block_tokens
            if hash_index >= len(hashes):
                break
            while chained < hash_index:
                chained += 1
                link = (chain, hashes[chained])
                chain = self._chains.setdefault(link, len(self._chains))
            keys.append((chain << _INDEX_BITS) | index)
        return keys

    def cached_prefix(self, table: BlockTable, max_blocks: int) -> list[BlockKey]:
        """Keys of the leading blocks of `table` already in the cache, up to `max_blocks`."""
        if not self.prefix_caching:
            return []
        hits: list[BlockKey] = []
        references = self._references
        for index in range(max_blocks):
            key = table.key(index)
            if key not in references:
                break
            hits.append(key)
        return hits

    def admit(self, table: BlockTable, hits: list[BlockKey], tokens: int) -> bool:
        """Take the cached `hits` and enough new blocks to hold `tokens` tokens, or nothing.

        Hits nobody holds leave the evictable set, so they count against the free blocks.
        """
        references = self._references
        new = blocks_for(tokens) - table.blocks - len(hits)
        revived = sum(1 for key in hits if references[key] == 0)
        if max(new, 0) + revived > self.free_blocks:
            return False
        for key in hits:
            count = references[key]
            if count == 0:
                del self._evictable[key]
            references[key] = count + 1
        table.keys.extend(hits)
        table.registered += len(hits)
        table.blocks += len(hits)
        self._take(table, new)
        return True

    def grow(self, table: BlockTable, tokens: int) -> bool:
        """Add blocks until `table` holds `tokens` tokens; False (and nothing taken) if short."""
        new = blocks_for(tokens) - table.blocks
        if new <= 0:
            return True
        if new > self.free_blocks:
            return False
        self._take(table, new)
        return True

    def _take(self, table: BlockTable, count: int) -> None:
        if count <= 0:
            return
        from_never_cached = min(count, self._never_cached)
        self._never_cached -= from_never_cached
        for _ in range(count - from_never_cached):
            evicted, _ = self._evictable.popitem(last=False)
            del self._references[evicted]
        table.anonymous += count
        table.blocks += count

    def cache_full_blocks(self, table: BlockTable, computed_tokens: int) -> None:
        """Offer the blocks that `computed_tokens` filled to the cache.

        A key already cached (another request computed the same prefix at the same time) leaves
        this block uncached, as vLLM does.
        """
        if not self.prefix_caching:
            return
        full = computed_tokens // KV_BLOCK_TOKENS
        references = self._references
        while table.registered < full:
            key = table.key(table.registered)
            table.registered += 1
            if key in references:
                continue
            references[key] = 1
            table.anonymous -= 1
            table.keys.append(key)

    def free(self, table: BlockTable) -> None:
        """Give back every block of `table`; cached ones stay cached, the tail evicted first."""
        references = self._references
        for key in reversed(table.keys):
            count = references[key] - 1
            references[key] = count
            if count == 0:
                self._evictable[key] = None
        self._never_cached += table.anonymous
        table.keys = []
        table.anonymous = 0
        table.registered = 0
        table.blocks = 0
