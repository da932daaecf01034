"""Sliding-window block freeing on the real engine (engine/kv/window.py, issue 29).

gemma3_text, gpt_oss and gemma4_text from hybrid_support.py have windows of 6
tokens; block_size 4. Prompts are 4x the window and longer: greedy ids must
equal mlx-lm's `generate_step` alone (one row, four rows batched, prefill in
chunks of 5, shorter than every prompt; a second turn over the first's
prefix, with a prefix hit; n = 2), while a decoding row holds at most
ceil((6 + 1) / 4) + 1 = 3 blocks (window.py rule 4) of the windowed layers' pool, seen in
`Engine.stats()` and /health's kv.kinds.
"""

from __future__ import annotations

import pytest
from engine_support import engine_factory, tokens
from hybrid_support import WINDOWED, engine_for, prompts, reference

from frink_mlx.adapters.admin import _kv
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
WINDOW, BLOCK = 6, 4
HELD = -(-(WINDOW + 1) // BLOCK) + 1  # window.py rule 4: one position more than the window


@pytest.fixture
def make_engine():
    yield from engine_factory(num_blocks=128, block_size=BLOCK, prefill_chunk_tokens=5,
                              context_ceiling=256)


@pytest.mark.parametrize("family", WINDOWED)
def test_a_row_at_four_windows_holds_the_window_and_matches_mlx_lm(make_engine, family):
    engine = engine_for(make_engine, family)
    assert engine.kv.windows is not None and engine.kv.windows.window == WINDOW + 1  # rule 4
    prompt = prompts(1, (4 * WINDOW,))[0]
    stream = engine.submit(SeqRequest("long", prompt, GREEDY, 16))
    got, seen = [], []
    for out in stream:
        if out.token_id is not None:
            got.append(out.token_id)
        if len(got) in (4, 12):
            stats = engine.stats()
            seen.append((stats.window_blocks_used, stats.num_blocks_used))
    assert got == reference(family, tuple(prompt), 16)
    for window_used, full_used in seen:
        assert window_used is not None and window_used <= HELD
        assert full_used >= (4 * WINDOW + 4) // BLOCK  # the full layers keep the history
    kv = _kv(engine.stats())
    assert kv is not None and kv["kinds"]["sliding"]["window"] == WINDOW + 1
    assert kv["kinds"]["sliding"]["blocks_used"] == 0 and kv["blocks_used"] == 0


@pytest.mark.parametrize("family", WINDOWED)
def test_four_long_rows_batched_and_chunked_match_mlx_lm(make_engine, family):
    engine = engine_for(make_engine, family)
    batch = prompts(2, (24, 31, 26, 40))
    streams = [engine.submit(SeqRequest(f"r{i}", p, GREEDY, 10)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        assert tokens(stream)[0] == reference(family, tuple(p), 10), f"row {i}"
    stats = engine.stats()
    assert (stats.num_blocks_used, stats.window_blocks_used) == (0, 0)


@pytest.mark.parametrize("family", WINDOWED)
def test_second_turn_hits_the_prefix_and_stays_exact(make_engine, family):
    engine = engine_for(make_engine, family)
    first = prompts(3, (30,))[0]
    out1 = tokens(engine.submit(SeqRequest("t1", first, GREEDY, 6)))[0]
    assert out1 == reference(family, tuple(first), 6)
    second = first + out1 + prompts(4, (9,))[0]
    outs = list(engine.submit(SeqRequest("t2", second, GREEDY, 6)))
    assert [o.token_id for o in outs if o.token_id is not None] == \
        reference(family, tuple(second), 6)
    assert outs[0].num_cached_tokens >= 28  # 7 full blocks of the first turn


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_n2_rows_past_the_window_both_match(make_engine, family):
    engine = engine_for(make_engine, family)
    prompt = prompts(5, (27,))[0]
    rows = tokens(engine.submit(SeqRequest("n2", prompt, GREEDY, 8, n=2)))
    want = reference(family, tuple(prompt), 8)
    assert rows == {0: want, 1: want}
    assert engine.stats().window_blocks_used == 0


@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss"])
def test_speculation_past_the_window_stays_exact(make_engine, family, monkeypatch):
    """Drafts are mlx-lm's own continuation with every third token wrong (as
    test_speculative.py's oracle), so verify rows accept some and reject some; rejected
    drafts' window blocks are trimmed with the full ones (kv/manager.py rule 8)."""
    from frink_mlx.engine.speculative import SpecConfig
    from frink_mlx.engine.speculative.lookup import RowDrafter

    prompt = prompts(6, (4 * WINDOW + 3,))[0]
    want = reference(family, tuple(prompt), 16)

    def propose(self, tokens_so_far, k):
        done = len(tokens_so_far) - len(prompt)
        draft = list(want[done:done + k])
        if len(draft) > 2 and len(tokens_so_far) % 3 == 0:
            draft[2] = (draft[2] + 1) % 300
        return draft

    monkeypatch.setattr(RowDrafter, "propose", propose)
    engine = engine_for(make_engine, family, spec=SpecConfig(max_draft=4))
    assert tokens(engine.submit(SeqRequest("spec", prompt, GREEDY, 16)))[0] == want
    stats = engine.stats()
    assert stats.draft_tokens_total > stats.draft_accepted_tokens_total > 0
    assert (stats.num_blocks_used, stats.window_blocks_used) == (0, 0)
