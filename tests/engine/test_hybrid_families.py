"""Hybrid and mixed-attention families on the paged engine (issue 29): greedy parity.

Each family is a tiny random model from its own `ModelArgs` (hybrid_support.py),
driven through the real `Engine` (its thread, scheduler, runner and the cache
kinds of kv/specs.py). Every row must equal mlx-lm's `generate_step` run
alone on its prompt: a row alone, four rows of different lengths batched,
prompts chunked (chunks shorter than every prompt), n = 2, and rows preempted
and recomputed; an aborted row gives back its blocks and its state slot.
Recurrent families also keep a prefix cache through state snapshots
(engine/kv/snapshots.py): a chat's second turn, n = 2 after a hit and four
batched rows on a shared system prompt report cached tokens and stay exact,
pipelined too; speculation (prompt lookup and a draft model) rolls a
rejected draft's state back and stays exact (engine/speculative/ rule 8).
Recurrent families (GatedDeltaNet, Mamba2, short convolutions) hold one
state slot per row; windowed families (gemma3_text, gpt_oss, gemma4_text,
with Gemma 4's KV-shared layers and per-layer head dims) have windows
shorter than the prompts.
"""

from __future__ import annotations

import functools
import types

import mlx.core as mx
import pytest
from engine_support import engine_factory, tokens
from hybrid_support import CONFIGS, RECURRENT, WINDOWED, engine_for, model, prompts, reference

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
FAMILIES = sorted(RECURRENT + WINDOWED)


@pytest.fixture
def make_engine():
    yield from engine_factory(num_blocks=128, prefill_chunk_tokens=5, context_ceiling=256)


def test_every_family_has_a_config():
    assert set(FAMILIES) <= set(CONFIGS)


@pytest.mark.parametrize("family", FAMILIES)
def test_alone_then_four_rows_batched_match_generate_step(make_engine, family):
    engine = engine_for(make_engine, family)
    alone = prompts(1, (13,))[0]
    assert tokens(engine.submit(SeqRequest("alone", alone, GREEDY, 8)))[0] == \
        reference(family, tuple(alone), 8)
    batch = prompts(2, (9, 4, 17, 23))
    streams = [engine.submit(SeqRequest(f"r{i}", p, GREEDY, 8)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        assert tokens(stream)[0] == reference(family, tuple(p), 8), f"row {i}"
    stats = engine.stats()
    assert stats.num_blocks_used == 0
    if family in RECURRENT:
        assert (stats.state_slots_used, stats.state_slots_total) == (0, 8)
    else:
        assert stats.state_slots_total is None


@pytest.mark.parametrize("family", FAMILIES)
def test_n2_rows_both_equal_generate_step(make_engine, family):
    engine = engine_for(make_engine, family)
    prompt = prompts(3, (11,))[0]
    rows = tokens(engine.submit(SeqRequest("n2", prompt, GREEDY, 6, n=2)))
    want = reference(family, tuple(prompt), 6)
    assert rows == {0: want, 1: want}
    assert engine.stats().state_slots_used in (None, 0)


@pytest.mark.parametrize("family", RECURRENT)
def test_preempted_rows_restart_their_state_and_stay_exact(make_engine, family):
    """A pool of 12 blocks cannot hold four 30-token rows: rows are preempted, freed
    (blocks and slot) and recomputed from their prompt and outputs."""
    engine = engine_for(make_engine, family, num_blocks=12, context_ceiling=48)
    batch = prompts(4, (14, 12, 10, 13))
    streams = [engine.submit(SeqRequest(f"p{i}", p, GREEDY, 16)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        assert tokens(stream)[0] == reference(family, tuple(p), 16), f"row {i}"
    assert engine.scheduler.num_preemptions > 0
    assert engine.stats().state_slots_used == 0


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_abort_gives_back_blocks_and_state_slot(make_engine, family):
    engine = engine_for(make_engine, family)
    stream = engine.submit(SeqRequest("long", prompts(5, (9,))[0], GREEDY, 200))
    seen = 0
    for out in stream:
        seen += 1
        if seen == 2:
            assert engine.stats().state_slots_used == 1
            stream.abort()
        if out.finish is not None:
            assert out.finish == "abort"
    stats = engine.stats()
    assert (stats.state_slots_used, stats.num_blocks_used) == (0, 0)


class Oracle:
    """Drafts each prompt's reference continuation, one token wrong whenever the row's
    length is a multiple of 3 (as test_speculative.py's), so verify rows keep all their
    drafts in some steps and reject some in others."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = references

    def propose(self, tokens: list[int], max_draft: int) -> list[int]:
        for prompt, ref in self.references.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                draft = list(ref[len(tokens) - len(prompt):][:max_draft])
                if draft and len(tokens) % 3 == 0:
                    draft[len(tokens) % len(draft)] = (draft[len(tokens) % len(draft)] + 1) % 299 + 1
                return draft
        return []


@pytest.mark.parametrize("family", RECURRENT)
def test_speculation_rolls_a_rejected_drafts_state_back_and_stays_exact(make_engine, family,
                                                                        monkeypatch):
    """engine/speculative/ rule 8: rows of different lengths, batched, drafting; a row that
    rejects drafts replays its kept tokens from its pre-verify state; greedy equals mlx-lm's."""
    from frink_mlx.engine.speculative import RowDrafter, SpecConfig

    engine = engine_for(make_engine, family, spec=SpecConfig(max_draft=4), pipeline=False)
    assert engine.config.spec is not None and engine.kv.enable_caching
    batch = prompts(12, (9, 14, 6))
    oracle = Oracle({tuple(p): reference(family, tuple(p), 12) for p in batch})
    monkeypatch.setattr(RowDrafter, "propose", lambda self, t, k: oracle.propose(t, k))
    streams = [engine.submit(SeqRequest(f"s{i}", p, GREEDY, 12)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        assert tokens(stream)[0] == reference(family, tuple(p), 12), f"row {i}"
    stats = engine.stats()
    assert 0 < stats.draft_accepted_tokens_total < stats.draft_tokens_total
    assert (stats.state_slots_used, stats.num_blocks_used) == (0, 0)


def turn(engine, request_id: str, prompt: list[int], n_out: int, n: int = 1):
    """One request's rows (token ids per row) and its cached_tokens."""
    rows: dict[int, list[int]] = {}
    cached = None
    for out in engine.submit(SeqRequest(request_id, prompt, GREEDY, n_out, n=n)):
        rows.setdefault(out.index, []).append(out.token_id)
        cached = out.num_cached_tokens if cached is None else cached
    return rows, cached


@pytest.mark.parametrize("family", RECURRENT)
def test_second_turn_restores_a_state_snapshot_and_stays_exact(make_engine, family):
    """Turn 2 (turn 1's prompt, its output, a new message) hits: the attention blocks up to
    the row's last snapshot (its tail, kv/snapshots.py rule 1) are reused, the recurrent
    layers restore it; greedy equals mlx-lm's run of the whole turn-2 prompt."""
    engine = engine_for(make_engine, family, snapshot_interval_blocks=4)  # kept: 16, 32, ...
    first = prompts(6, (17,))[0]
    rows, cached = turn(engine, "t1", first, 6)
    assert rows[0] == reference(family, tuple(first), 6) and cached == 0
    second = first + rows[0] + prompts(7, (5,))[0]
    rows, cached = turn(engine, "t2", second, 6)
    assert rows[0] == reference(family, tuple(second), 6)
    assert cached == 20  # the tail: 17 + 5 fed tokens, last boundary at 20 (block_size 4)
    # The same prompt again: a hit stops short of its last token (manager rule 1), at 24;
    # the deepest snapshot before it is still turn 1's tail (turn 2's chunks ended at 25, 28)
    again, cached = turn(engine, "t3", second, 6)
    assert again == rows and cached == 20
    assert engine.stats().extra["state_snapshots_used"] > 0


@pytest.mark.parametrize("family", RECURRENT)
def test_n2_after_a_hit_both_rows_exact(make_engine, family):
    engine = engine_for(make_engine, family)
    first = prompts(8, (13,))[0]
    out, _ = turn(engine, "t1", first, 5)
    second = first + out[0] + prompts(9, (6,))[0]
    rows, cached = turn(engine, "t2", second, 6, n=2)
    want = reference(family, tuple(second), 6)
    assert rows == {0: want, 1: want} and cached > 0
    assert engine.stats().state_slots_used == 0


@pytest.mark.parametrize("family", RECURRENT)
def test_batched_rows_of_different_lengths_hit_a_shared_prefix(make_engine, family):
    """An agent's system prompt: once it ran, four rows on it with suffixes of different
    lengths, batched, each restore the snapshot at its interval and stay exact."""
    engine = engine_for(make_engine, family)
    system = prompts(10, (21,))[0]
    turn(engine, "warm", system, 2)
    every = engine.kv.snapshots.interval_tokens
    batch = [system + s for s in prompts(11, (3, 9, 1, 14))]
    streams = [engine.submit(SeqRequest(f"r{i}", p, GREEDY, 8)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        outs = list(stream)
        assert [o.token_id for o in outs] == reference(family, tuple(p), 8), f"row {i}"
        cached = outs[0].num_cached_tokens  # at least its last interval; a tail may be later
        assert len(system) >= cached >= (len(system) // every) * every and cached > 0


@functools.cache
def llama_draft():
    """A one-layer llama on the hybrids' vocabulary: the draft model (its KV is paged)."""
    from mlx_lm.models import llama

    args = llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=1,
                           intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                           rms_norm_eps=1e-5, vocab_size=300, tie_word_embeddings=True)
    draft = llama.Model(args)
    mx.eval(draft.parameters())
    return types.SimpleNamespace(model=draft, dtype=mx.float32, context_length=512)


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "lfm2"])
def test_a_draft_model_speculates_on_a_hybrid_and_stays_exact(make_engine, family):
    """engine/speculative/ rule 8 with the draft model's tokens (mostly rejected: the state
    rolls back nearly every step); a draft model with recurrent layers is not used."""
    from frink_mlx.engine.speculative import SpecConfig

    spec = SpecConfig(max_draft=3, max_rows=8, draft_step_cost=0.01)
    engine = engine_for(make_engine, family, draft=llama_draft(), spec=spec, pipeline=False)
    batch = prompts(13, (7, 12))
    streams = [engine.submit(SeqRequest(f"d{i}", p, GREEDY, 10)) for i, p in enumerate(batch)]
    for i, (p, stream) in enumerate(zip(batch, streams)):
        assert tokens(stream)[0] == reference(family, tuple(p), 10), f"row {i}"
    assert engine.stats().extra["draft_model_tokens_total"] > 0
    recurrent_draft = types.SimpleNamespace(model=model("lfm2"), dtype=mx.float32)
    assert engine_for(make_engine, family, draft=recurrent_draft, spec=spec)._draft is None


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_pipelined_steps_bind_decode_snapshots_once_their_tokens_come_back(make_engine, family):
    """Pipelined (Metal's loop.py order: step t+1 planned before step t is read back), a decode
    snapshot is taken before its block's last token is on the host and bound when it is
    (kv/snapshots.py rule 2); turn 2 still restarts at turn 1's tail and stays exact."""
    engine = engine_for(make_engine, family, snapshot_interval_blocks=4, pipeline=True)
    first = prompts(14, (17,))[0]
    rows, _ = turn(engine, "t1", first, 9)
    second = first + rows[0] + prompts(15, (4,))[0]
    rows, cached = turn(engine, "t2", second, 6)
    assert rows[0] == reference(family, tuple(second), 6)
    assert cached == 24  # 17 + 8 fed tokens: the tail at the last boundary, 24
