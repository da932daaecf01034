"""Per-sequence block tables over one `BlockPool`, and the prefix-cache protocol.

Why: the scheduler plans in integers. It asks this manager "which leading
blocks of this prompt are already computed?", "give this sequence room for N
more tokens" and "where do these tokens' K/V go?"; the runner turns the answers
(block ids and flat slot numbers) into MLX scatters and gathers. No MLX here.

A sequence's life, as the engine drives it:

    blocks, n = get_computed_blocks(prompt, extra)     # prefix hit: n tokens skip prefill
    allocate_slots(seq, len(prompt) - n, blocks)       # None -> stay queued, nothing changed
    ... write K/V at slot_mapping(seq, n, len(prompt) - n), run the model ...
    cache_blocks(seq, tokens_with_kv, extra)           # publish newly full blocks
    allocate_slots(seq, 1) ... per decode step         # grows by a block every block_size tokens
    free(seq)                                          # blocks go back, keeping their hashes

Rules, in order:
 1. A prefix hit covers whole blocks only and never the last prompt token: the
    model must run at least one token to produce next-token logits. With prompt
    length L that is at most floor((L-1)/block_size) blocks.
 2. `allocate_slots` either fully succeeds or returns None with no side effects.
    Cached free blocks count as free (they are evicted on demand), except the
    very blocks this call revives as computed blocks.
 3. Call `allocate_slots` right after `get_computed_blocks` for the same sequence
    (same scheduler step, nothing allocated in between); a computed block that
    was evicted meanwhile is an engine bug and raises `EngineFailure`.
 4. `cache_blocks` is incremental: each sequence remembers the chained hashes
    it has published, so each block is hashed once.
 5. `cache_prompt=False` (llama.cpp's field), passed to both
    `get_computed_blocks` and `cache_blocks`, makes a sequence neither read nor
    publish cached blocks. `enable_caching=False` does the same for every sequence.
 6. `free` releases a table tail-first so the tail is evicted before the head
    (heads are the shared system prompts and histories).
 7. `fork` gives the child the parent's *full* blocks only (ref++); the engine
    recomputes the remaining < block_size tokens into the child's own block, so
    two rows never write into one block.
 8. `trim` gives back the slots of rejected speculative positions (engine/speculative/):
    the table shrinks to `num_tokens` and blocks left empty are freed. It never
    cuts into a published block, and the blocks it frees were never hashed
    (only positions with written K/V of known tokens are published).
 9. With `num_state_slots` (a model with recurrent layers, kv/specs.py) every
    sequence also holds one state slot (kv/slots.py): `allocate_slots` takes
    it with the sequence's first blocks (a forked child: with its own first
    allocation), all or nothing as rule 2 says, and `free` gives it back.
    `fork_copies` names what a child copies from its parent once the
    parent's prompt ran: the partial last block (rule 7) and the state slot.
10. With `num_snapshots` as well, the prefix cache holds recurrent-state
    snapshots (kv/snapshots.py): a hit is cut back to the deepest cached
    block with a snapshot (its rule 3), and the sequence's first allocation
    records that snapshot for `take_restore`; publishing a block binds the
    snapshot taken at its end (its rule 2), `free` releases the row's own.
    Without snapshots a model with recurrent layers caches nothing.
11. With `window` (a model with sliding-window layers) every sequence also
    has a window table over a second pool (kv/window.py, its rules): allocated
    with the full table, published with it, shortened by `free_outside_window`,
    shared by `fork` and `trim`med alike; a prefix hit must hold in both.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ...errors import EngineFailure
from .block_pool import BlockPool, KVBlock
from .hashing import iter_block_hashes
from .slots import SlotPool
from .snapshots import ROLLBACK, SnapshotIndex
from .window import WindowTables, window_ids

SeqId = Hashable


@dataclass(slots=True)
class SeqBlocks:
    """One sequence's share of the pool."""

    blocks: list[KVBlock] = field(default_factory=list)
    num_tokens: int = 0  # token slots reserved: positions [0, num_tokens)
    block_hashes: list[int] = field(default_factory=list)  # published chain, blocks[:len]
    slot: int = -1  # recurrent-state slot (rule 9); -1: none held
    restore: int = -1  # the snapshot its state starts from (rule 10); -1: none
    window_blocks: list[KVBlock | None] = field(default_factory=list)  # rule 11; None: freed


class KVCacheManager:
    """Block tables for every live sequence over `num_blocks` blocks of `block_size` tokens."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 num_state_slots: int = 0, num_snapshots: int = 0,
                 snapshot_interval_blocks: int = 1, window: int | None = None) -> None:
        if block_size <= 0:
            raise EngineFailure(f"block_size must be positive, got {block_size}", param="block_size")
        self.pool = BlockPool(num_blocks)
        self.state_slots = SlotPool(num_state_slots) if num_state_slots else None  # rule 9
        self.windows = WindowTables(num_blocks, block_size, window) if window else None  # rule 11
        self._block_size = block_size
        self.snapshots = SnapshotIndex(  # rule 10
            num_snapshots, snapshot_interval_blocks, block_size,
            lambda block_hash: self.pool.get_cached_block(block_hash) is not None) \
            if num_snapshots and self.state_slots is not None else None
        self.enable_caching = enable_caching
        self._seqs: dict[SeqId, SeqBlocks] = {}

    # -- counters ----------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.pool.num_cached_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    @property
    def num_seqs(self) -> int:
        return len(self._seqs)

    def __contains__(self, seq_id: SeqId) -> bool:
        return seq_id in self._seqs

    def _seq(self, seq_id: SeqId) -> SeqBlocks:
        state = self._seqs.get(seq_id)
        if state is None:
            raise EngineFailure(f"unknown sequence {seq_id!r}", param="seq_id")
        return state

    def block_table(self, seq_id: SeqId) -> list[int]:
        return [block.block_id for block in self._seq(seq_id).blocks]

    def num_tokens(self, seq_id: SeqId) -> int:
        """Token slots reserved for `seq_id` so far (computed + allocated)."""
        return self._seq(seq_id).num_tokens

    def state_slot(self, seq_id: SeqId) -> int:
        """The sequence's recurrent-state slot (rule 9); -1 when the model has none."""
        return self._seq(seq_id).slot

    # -- prefix lookup and allocation -------------------------------------------

    def get_computed_blocks(
        self, token_ids: Sequence[int], extra_key: tuple, *, cache_prompt: bool = True
    ) -> tuple[list[KVBlock], int]:
        """The longest run of cached full blocks that prefixes `token_ids` (rule 1).

        Algorithm: walk the chained hashes of blocks 0, 1, ... up to the cap and
        stop at the first hash the pool does not know; a later block cannot hit
        once an earlier one missed, since its hash covers the whole prefix.
        """
        if not (self.enable_caching and cache_prompt) or not token_ids:
            return [], 0
        max_blocks = (len(token_ids) - 1) // self._block_size
        hits: list[KVBlock] = []
        for block_hash in iter_block_hashes(
            token_ids, self._block_size, extra_key, stop_block=max_blocks
        ):
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        if self.windows is not None:  # rule 11 (kv/window.py rule 3)
            hits = hits[:self.windows.longest_hit(hits)]
        if self.snapshots is not None:  # rule 10
            del hits[self.snapshots.lookup([b.block_hash or 0 for b in hits])[0]:]
        return hits, len(hits) * self._block_size

    def blocks_needed(
        self, seq_id: SeqId, num_new_tokens: int, computed_blocks: Sequence[KVBlock] = ()
    ) -> int:
        """How many free-queue blocks `allocate_slots` would consume (a dry run)."""
        num_new_blocks, num_revived = self._count_blocks(seq_id, num_new_tokens, computed_blocks)
        return num_new_blocks + num_revived

    def _count_blocks(
        self, seq_id: SeqId, num_new_tokens: int, computed_blocks: Sequence[KVBlock]
    ) -> tuple[int, int]:
        """(blocks to take from the free queue, computed blocks to revive off it)."""
        state = self._seqs.get(seq_id)
        num_held = len(computed_blocks) if state is None else len(state.blocks)
        num_tokens = len(computed_blocks) * self._block_size if state is None else state.num_tokens
        num_required = -(-(num_tokens + num_new_tokens) // self._block_size)  # ceil division
        num_revived = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        return max(0, num_required - num_held), num_revived

    def allocate_slots(
        self, seq_id: SeqId, num_new_tokens: int, computed_blocks: Sequence[KVBlock] = ()
    ) -> list[int] | None:
        """Grow `seq_id`'s table to hold `num_new_tokens` more tokens; new block ids or None.

        The first call for a sequence may pass the blocks `get_computed_blocks`
        returned; they open the table (touched: ref++, revived off the free queue)
        and count as computed tokens. Later calls must not pass any.
        """
        if num_new_tokens < 0:
            raise EngineFailure(f"num_new_tokens must be >= 0, got {num_new_tokens}",
                                param="num_new_tokens")
        state = self._seqs.get(seq_id)
        if state is not None and computed_blocks:
            raise EngineFailure(f"sequence {seq_id!r} already has blocks; computed_blocks "
                                "are only accepted on its first allocation", param="computed_blocks")
        computed_hashes = self._hashes_of_cached(computed_blocks)
        num_new_blocks, num_revived = self._count_blocks(seq_id, num_new_tokens, computed_blocks)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        windows = self.windows
        if windows is not None and num_new_blocks + windows.num_revived(computed_blocks) > \
                windows.pool.num_free_blocks:  # rule 11: all or nothing in both pools
            return None
        slots = self.state_slots
        wants_slot = slots is not None and (state is None or state.slot < 0)
        if wants_slot and slots is not None and slots.num_free == 0:  # rule 9: all or nothing
            return None
        # Touch first: reviving computed blocks takes them off the free queue, so
        # the eviction below cannot hand one of them out as a "new" block.
        self.pool.touch(computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks)
        if new_blocks is None:  # unreachable: counted above
            raise EngineFailure("block pool shrank during allocation")
        if state is None:
            state = SeqBlocks(
                blocks=list(computed_blocks),
                num_tokens=len(computed_blocks) * self._block_size,
                block_hashes=computed_hashes,
                window_blocks=windows.opened(computed_blocks) if windows is not None else [],
            )
            self._seqs[seq_id] = state
            if self.snapshots is not None and computed_hashes:  # rule 10
                state.restore = self.snapshots.lookup(computed_hashes)[1]
        if windows is not None:
            new_window = windows.pool.get_new_blocks(num_new_blocks)
            if new_window is None:  # unreachable: counted above
                raise EngineFailure("window block pool shrank during allocation")
            state.window_blocks.extend(new_window)
        if wants_slot and slots is not None:
            taken = slots.take()  # counted above: never None here
            state.slot = -1 if taken is None else taken
        state.blocks.extend(new_blocks)
        state.num_tokens += num_new_tokens
        return [block.block_id for block in new_blocks]

    def _hashes_of_cached(self, computed_blocks: Sequence[KVBlock]) -> list[int]:
        """The computed blocks' hashes, checking each is still the cached one (rule 3)."""
        hashes: list[int] = []
        for block in computed_blocks:
            if block.block_hash is None or self.pool.get_cached_block(block.block_hash) is not block:
                raise EngineFailure(
                    f"computed block {block.block_id} was evicted before allocate_slots "
                    "(call it right after get_computed_blocks)",
                    param="computed_blocks",
                )
            hashes.append(block.block_hash)
        return hashes

    # -- publishing, freeing, forking --------------------------------------------

    def cache_blocks(
        self, seq_id: SeqId, token_ids: Sequence[int], extra_key: tuple,
        *, cache_prompt: bool = True,
    ) -> int:
        """Publish every block of `seq_id` that `token_ids` fills and is not yet hashed.

        `token_ids` are all the sequence's tokens whose K/V has been written (never
        more than its reserved slots). Returns how many blocks were newly hashed.
        """
        if not (self.enable_caching and cache_prompt):
            return 0
        state = self._seq(seq_id)
        if len(token_ids) > state.num_tokens:
            raise EngineFailure(
                f"{len(token_ids)} tokens given but sequence {seq_id!r} has only "
                f"{state.num_tokens} slots", param="token_ids")
        start = len(state.block_hashes)
        parent = state.block_hashes[-1] if start else None
        hashes = iter_block_hashes(token_ids, self._block_size, extra_key,
                                   parent=parent, start_block=start)
        for index, block_hash in enumerate(hashes, start):
            self.pool.cache_full_block(state.blocks[index], block_hash)
            state.block_hashes.append(block_hash)
            if self.snapshots is not None:  # rule 10
                self.snapshots.bind(seq_id, (index + 1) * self._block_size, block_hash)
            window = state.window_blocks[index] if self.windows is not None else None
            if window is not None and self.windows is not None:  # rule 11
                self.windows.pool.cache_full_block(window, block_hash)
        return len(state.block_hashes) - start

    def free(self, seq_id: SeqId, *, preempted: bool = False) -> bool:
        """Release every block of `seq_id`, tail first (rule 6). False if it held none.
        `preempted`: freed while its step is planned (kv/snapshots.py rule 2)."""
        if self.snapshots is not None:
            self.snapshots.release_seq(seq_id, preempted=preempted)
        state = self._seqs.pop(seq_id, None)
        if state is None:
            return False
        self.pool.free_blocks(reversed(state.blocks))
        if self.windows is not None:
            self.windows.release(state.window_blocks)
        if state.slot >= 0 and self.state_slots is not None:
            self.state_slots.give(state.slot)
        return True

    def fork_copies(self, parent_seq_id: SeqId, child_seq_id: SeqId, num_shared: int,
                    num_tokens: int) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
        """What a forked child copies once its parent's `num_tokens` ran (rules 7, 9):
        ([(src block, dst block, slots)], [(src state slot, dst state slot)])."""
        parent, child = self._seq(parent_seq_id), self._seq(child_seq_id)
        blocks: list[tuple[int, int, int]] = []
        if num_tokens > num_shared:
            index = num_shared // self._block_size
            blocks.append((parent.blocks[index].block_id, child.blocks[index].block_id,
                           num_tokens - num_shared))
        states = [(parent.slot, child.slot)] if parent.slot >= 0 and child.slot >= 0 else []
        return blocks, states

    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId, num_tokens: int | None = None) -> int:
        """Open `child_seq_id` sharing the parent's full blocks (rule 7).

        `num_tokens` is how many of the parent's tokens have K/V written (default:
        all reserved). Returns the child's computed token count, a multiple of
        block_size; the child's table then grows with `allocate_slots`.
        """
        parent = self._seq(parent_seq_id)
        if child_seq_id in self._seqs:
            raise EngineFailure(f"sequence {child_seq_id!r} already exists", param="child_seq_id")
        limit = parent.num_tokens if num_tokens is None else num_tokens
        if not 0 <= limit <= parent.num_tokens:
            raise EngineFailure(f"num_tokens must be in [0, {parent.num_tokens}], got {limit}",
                                param="num_tokens")
        num_full = limit // self._block_size
        shared = parent.blocks[:num_full]
        self.pool.touch(shared)
        window = parent.window_blocks[:num_full]
        if self.windows is not None:
            self.windows.pool.touch(b for b in window if b is not None)
        self._seqs[child_seq_id] = SeqBlocks(
            blocks=list(shared),
            num_tokens=num_full * self._block_size,
            block_hashes=parent.block_hashes[:num_full],
            window_blocks=window,
        )
        return num_full * self._block_size

    def trim(self, seq_id: SeqId, num_tokens: int) -> int:
        """Shrink `seq_id`'s reserved slots to `num_tokens` (rule 8); returns blocks freed."""
        state = self._seq(seq_id)
        bs = self._block_size
        if not len(state.block_hashes) * bs <= num_tokens <= state.num_tokens:
            raise EngineFailure(
                f"cannot trim sequence {seq_id!r} to {num_tokens} tokens: it holds "
                f"{state.num_tokens}, {len(state.block_hashes) * bs} of them published",
                param="num_tokens")
        keep = -(-num_tokens // bs)
        dropped = state.blocks[keep:]
        del state.blocks[keep:]
        state.num_tokens = num_tokens
        self.pool.free_blocks(reversed(dropped))
        if self.windows is not None:
            self.windows.release(state.window_blocks[keep:])
            del state.window_blocks[keep:]
        return len(dropped)

    def reset_prefix_cache(self) -> int:
        """Forget every free block's hash, the snapshots bound to them and those the
        step being planned took (it failed); returns how many blocks were dropped."""
        if self.windows is not None:
            self.windows.pool.reset_prefix_cache()
        dropped = self.pool.reset_prefix_cache()
        if self.snapshots is not None:
            self.snapshots.prune()
            self.snapshots.prune(this_step=True)
        return dropped

    # -- recurrent-state snapshots (rule 10, kv/snapshots.py) ------------------------

    def begin_step(self) -> None:  # the scheduler plans a step (kv/snapshots.py rule 3)
        if self.snapshots is not None:
            self.snapshots.new_step()

    def snapshot_stop(self, start: int, num_tokens: int, target: int) -> int:
        """A prefill chunk's length, cut where snapshots are taken (snapshots rule 1)."""
        return num_tokens if self.snapshots is None else \
            self.snapshots.stop(start, num_tokens, target)

    def plan_snapshot(self, seq_id: SeqId, num_tokens: int, *, tail: bool = False,
                      cache_prompt: bool = True) -> int | None:
        """The snapshot id a forward leaving `seq_id` at `num_tokens` fills, or None."""
        if self.snapshots is None or not (self.enable_caching and cache_prompt) \
                or num_tokens % self._block_size:
            return None
        hashes = self._seq(seq_id).block_hashes
        index = num_tokens // self._block_size - 1
        return self.snapshots.reserve(seq_id, num_tokens,
                                      hashes[index] if index < len(hashes) else None, tail=tail)

    def roll_back_state(self, seq_id: SeqId) -> None:
        """Its state restarts from before its last verify (engine/speculative/ rule 8)."""
        self._seq(seq_id).restore = ROLLBACK

    def take_restore(self, seq_id: SeqId) -> int:
        """The snapshot its state starts from (rule 10), or ROLLBACK, once; -1: none."""
        state = self._seq(seq_id)
        restore, state.restore = state.restore, -1
        return restore

    # -- sliding windows (rule 11) ---------------------------------------------------

    def free_outside_window(self, seq_id: SeqId, position: int) -> int:
        """kv/window.py rule 1: the next query of `seq_id` sits at `position`."""
        if self.windows is None:
            return 0
        return self.windows.free_outside(self._seq(seq_id).window_blocks, position)

    def window_table(self, seq_id: SeqId) -> list[int] | None:
        """The windowed layers' block ids (-1: freed); None without windowed layers."""
        if self.windows is None:
            return None
        return window_ids(self._seq(seq_id).window_blocks)

    def window_fork_copy(self, parent_seq_id: SeqId, child_seq_id: SeqId, num_shared: int,
                         num_tokens: int) -> list[tuple[int, int, int]]:
        """`fork_copies`' partial block in the windowed layers' pool (rules 7, 11)."""
        parent, child = self._seq(parent_seq_id), self._seq(child_seq_id)
        if self.windows is None or num_tokens <= num_shared:
            return []
        index = num_shared // self._block_size
        src, dst = parent.window_blocks[index], child.window_blocks[index]
        if src is None or dst is None:
            raise EngineFailure("a forked row's last block is outside its window")
        return [(src.block_id, dst.block_id, num_tokens - num_shared)]

    # -- slots for the runner ------------------------------------------------------

    def slot_mapping(self, seq_id: SeqId, start_pos: int, num_tokens: int) -> list[int]:
        """Flat slot of each position in [start_pos, start_pos + num_tokens).

        Position p lives in table[p // block_size] at offset p % block_size:

            positions   0  1  2  3 |  4  5  6  7 |  8  9        (block_size 4)
            table       block 5    |  block 2    |  block 7
            slots      20 21 22 23 |  8  9 10 11 | 28 29        slot = id*4 + p%4

        Algorithm: walk block by block, emitting the run of consecutive slots
        the range covers inside each block.
        """
        state = self._seq(seq_id)
        end = start_pos + num_tokens
        if start_pos < 0 or num_tokens < 0 or end > state.num_tokens:
            raise EngineFailure(
                f"positions [{start_pos}, {end}) are outside sequence {seq_id!r}'s "
                f"{state.num_tokens} reserved slots", param="start_pos")
        bs = self._block_size
        slots: list[int] = []
        pos = start_pos
        while pos < end:
            index, offset = divmod(pos, bs)
            base = state.blocks[index].block_id * bs
            run = min(bs - offset, end - pos)
            slots.extend(range(base + offset, base + offset + run))
            pos += run
        return slots

    def slots_for(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        """Slots of positions 0..num_tokens-1: the row's read index into the pool."""
        return self.slot_mapping(seq_id, 0, num_tokens)
