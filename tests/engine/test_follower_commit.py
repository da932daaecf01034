"""engine/follower.py message 2: what a rank answers to `Commit`, and when the ranks'
answers cannot serve a generation together (serving/distributed.py rule 2)."""

from __future__ import annotations

import types

from frink_mlx.engine.follower import ShardOffer, commit_row, disagreement
from frink_mlx.engine.kv.specs import AttentionSpec, ModelCacheSpec, StateSpec


def _offer(*, blocks: int = 50, snapshots: int = 8, state: bool = True,
           window: int | None = None, split: int = 1) -> ShardOffer:
    spec = ModelCacheSpec("stub", (), (AttentionSpec(2, 16, 16, window),),
                          (StateSpec(((3, 4),), (types.SimpleNamespace(size=4),)),)  # type: ignore[arg-type]
                          if state else ())
    return ShardOffer(model=None, dtype=None, forward=None,  # type: ignore[arg-type]
                      num_blocks=blocks, block_size=4, split=split, cache_spec=spec,
                      num_state_slots=4, num_snapshots=snapshots)


def test_a_row_carries_the_blocks_snapshots_and_cache_kinds():
    assert commit_row(_offer(window=6)) == [1, 50, 1, 8, 1, 7]  # w: the window plus one
    assert commit_row(_offer(state=False)) == [1, 50, 1, 8, 0, 0]
    assert commit_row(None) == [0] * 6


def test_ranks_agree_on_the_split_and_the_kinds_not_on_the_amounts():
    rows = [commit_row(_offer()), commit_row(_offer(blocks=20, snapshots=2))]
    assert disagreement(rows) is None  # the smallest pool and snapshot count are taken
    assert "rank(s) [1] could not load" in str(disagreement([rows[0], commit_row(None)]))
    assert "distributed_split" in str(disagreement([rows[0], commit_row(_offer(split=2))]))
    assert "recurrent layers" in str(disagreement([rows[0], commit_row(_offer(state=False))]))
    assert "sliding window" in str(disagreement([rows[0], commit_row(_offer(window=6))]))
