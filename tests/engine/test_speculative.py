"""Speculative decoding (engine/speculative/): token-exact greedy, the target distribution
when sampling, KV rollback, and the policy's pieces.

Two kinds of drafts are used. Random tiny models are chaotic (a few more tokens of
context change every later token), so prompt lookup alone rarely fires on them:
- the real n-gram drafter runs on a *copying* model (attention output zeroed, so the
  next token depends on the last one only): the prompt P + G + P, G the greedy
  continuation of P, then continues as G and every draft is accepted;
- an oracle drafter (the `propose` of `RowDrafter` swapped for the test) proposes the
  reference continuation with every third draft corrupted, on the normal tiny model,
  so verification accepts, rejects and rolls back KV in every step shape the engine
  has (mixed batches, prefix hits, chunked prefill, n > 1, grammars, stop tokens).
"""

from __future__ import annotations

import math
import random
import time

import mlx.core as mx
import numpy as np
import pytest
from engine_support import engines, greedy, loaded, random_prompt, tokens

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import draft_pool_blocks
from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.sampling import RowSampler, draft_samplers, sample
from frink_mlx.engine.scheduler import Scheduler
from frink_mlx.engine.speculative import RowDrafter, SpecConfig, StepCostModel
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
SPEC = SpecConfig(max_draft=6, ngram_max=3)


def _silence_attention_outputs(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * 0.0


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return loaded(tiny_llama_dir)


@pytest.fixture(scope="module")
def copying(tiny_llama_dir):
    return loaded(tiny_llama_dir, _silence_attention_outputs)


@pytest.fixture
def make_engine():
    yield from engines(SPEC)


class Oracle:
    """Drafts the reference continuation of each known prompt; when the row's length is
    a multiple of 3 one draft token is corrupted (a function of the tokens only, like
    prompt lookup, so seeded rows see the same drafts every run)."""

    def __init__(self, references: dict[tuple[int, ...], list[int]]) -> None:
        self.references = references

    def propose(self, drafter: RowDrafter, tokens, max_draft: int) -> list[int]:
        for prompt, ref in self.references.items():
            if tuple(tokens[:len(prompt)]) == prompt:
                done = len(tokens) - len(prompt)
                draft = list(ref[done:done + max_draft])
                if draft and len(tokens) % 3 == 0:
                    at = len(tokens) % len(draft)
                    draft[at] = (draft[at] + 1) % 380 + 3
                return draft
        return []


@pytest.fixture
def oracle(monkeypatch):
    board = Oracle({})
    monkeypatch.setattr(RowDrafter, "propose", lambda self, t, k: board.propose(self, t, k))
    return board


# -- the policy --------------------------------------------------------------------


def test_drafter_proposes_what_followed_the_latest_match():
    d = RowDrafter(ngram_max=3)
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3]
    assert d.propose(tokens, 4) == [7, 8, 2, 3]      # latest "2 3" is followed by 7 8
    assert d.propose(tokens + [7], 2) == [8, 2]      # "3 7" grows the index incrementally
    assert RowDrafter(ngram_max=3).propose([1, 2, 3, 1, 2], 0) == []
    assert RowDrafter(ngram_max=3).propose([1, 2, 3, 4], 3) == []  # no earlier match


def test_drafter_picks_the_copy_up_again_after_the_model_departs_from_it():
    """An edit copies its snippet with one name changed: after the change the n-gram
    also matches a later repeat in the snippet, but the copy goes on right after it."""
    prompt = [7, 8, 1, 50, 2, 3, 4, 9, 9, 1, 50, 2, 3, 6]  # "2 3" is followed by 4, later by 6
    d = RowDrafter(ngram_max=3)
    assert d.propose(prompt + [7, 8], 4) == [1, 50, 2, 3]
    d.record(4, 1)  # "1" kept; the model writes 60 where the snippet has 50
    assert d.propose(prompt + [7, 8, 1, 60, 2, 3], 3) == [4, 9, 9]  # not the later "2 3 -> 6"
    assert RowDrafter(ngram_max=3).propose(prompt + [7, 8, 1, 60, 2, 3], 3) == [6, 7, 8]  # latest


def test_acceptance_cools_a_row_and_probes_later():
    d = RowDrafter(ngram_max=3)
    for _ in range(6):
        d.record(4, 0)
    assert d.is_cold and not d.may_draft()
    for _ in range(8):
        d.record(0, 0)
    assert d.may_draft()
    d.record(4, 4)
    d.record(4, 4)
    assert not d.is_cold


def test_cost_model_speculates_only_when_it_pays():
    cost = StepCostModel()
    good, bad = RowDrafter(3, alpha=0.9), RowDrafter(3, alpha=0.05)
    assert cost.choose_width(1, [(good, 8)], 8, context=512) > 4
    assert cost.choose_width(1, [(bad, 8)], 8, context=512) == 1
    assert cost.choose_width(8, [(bad, 8)], 8, context=512) == 1
    # every position attends over the context: long ones make wide steps dear
    fair = [(RowDrafter(3, alpha=0.6), 8)] * 8
    assert cost.choose_width(8, fair, 8, context=4000) == 1
    assert cost.choose_width(8, fair, 8, context=100) > 1
    for _ in range(50):  # a machine where every extra position costs as much as a step
        cost.observe(1, 0.010)
        cost.observe(10, 0.100)
    assert cost.ratio > 0.5
    assert cost.choose_width(8, [(RowDrafter(3, alpha=0.6), 8)], 8) == 1


def test_cost_model_fits_its_context_term_from_timed_steps():
    cost = StepCostModel()
    rng = random.Random(0)
    for _ in range(200):  # a machine whose positions cost mostly attention
        rows, width, context = rng.choice([1, 4, 8]), rng.choice([1, 3, 6]), rng.choice([100, 2000])
        cost.observe(rows * width, 0.1 + 0.001 * rows * width + 0.05 * rows * width * context / 1000,
                     context)
    c1, c2 = cost.ratios  # truth 0.01 and 0.5; the prior alone says 0.02 and 0.125
    for context in (100, 2000):
        truth = 0.01 + 0.5 * context / 1000
        assert abs(c1 + c2 * context / 1000 - truth) < 0.25 * truth


def test_a_stalled_step_on_a_loaded_machine_does_not_switch_speculation_off():
    """One row decoding plainly (one width, a context that barely moves) says nothing
    about what a position costs; one step stalled 5x among them once fitted as "no
    fixed part" and no step drafted again (tests/serving/test_draft_generation.py on
    the loaded 2-core machine). Nor does one stalled verify step switch it off."""
    cost = StepCostModel()
    for i in range(14):
        cost.observe(1, 0.012, 44 + i)
    cost.observe(1, 0.060, 58)  # the OS took the core for one step
    c1, c2 = cost.ratios
    assert abs(c1 - 0.02) < 0.01 and abs(c2 - 0.125) < 0.05  # the prior's: nothing measured
    drafter = RowDrafter(3, alpha=0.6, model_alpha=0.6)
    assert cost.choose_width(1, [], 8, [(drafter, 8)], draft_step_cost=0.19, context=44) > 1
    cost.observe(2, 0.060, 46)  # and the first verify step stalled too
    assert cost.choose_width(1, [], 8, [(drafter, 8)], draft_step_cost=0.19, context=46) > 1


def test_rejected_positions_are_rolled_back_and_never_cached(monkeypatch):
    """Block tables shrink to the accepted tokens; blocks of rejected positions go back
    to the pool unhashed; the published chain covers accepted tokens only."""
    monkeypatch.setattr(RowDrafter, "propose", lambda self, t, k: [51, 52, 53, 54, 55, 56][:k])
    kv = KVCacheManager(32, 4)
    sched = Scheduler(kv, max_batch=4, prefill_chunk_tokens=64, spec=SpecConfig(max_draft=6))
    monkeypatch.setattr(StepCostModel, "choose_width", lambda self, n, rows, k, *_: 7)  # whole draft
    sched.add(SeqRequest("a", list(range(10, 16)), GREEDY, 20))
    plan = sched.schedule()  # prefill 6 tokens, samples token 6
    sched.update(plan.sample_seq_ids, [50])
    plan = sched.schedule()  # decode at 6 + drafts 51..56 at 7..12
    (row,) = plan.decode
    assert row.position == 6 and row.draft == [51, 52, 53, 54, 55, 56] and plan.width == 7
    assert kv.num_tokens(row.seq_id) == 13 and len(kv.block_table(row.seq_id)) == 4
    sched.update_rows([row.seq_id], [[51, 52, 99]])  # 51, 52 accepted, 99 replaces 53
    seq = sched.seqs[row.seq_id]
    assert seq.token_ids[6:] == [50, 51, 52, 99]
    assert seq.num_computed == 9 and kv.num_tokens(row.seq_id) == 9
    assert len(kv.block_table(row.seq_id)) == 3  # positions 8..9 live in block 3
    assert len(kv._seq(row.seq_id).block_hashes) == 2  # 0..7 known and written
    assert sched.speculator.num_drafted_total == 6 and sched.speculator.num_accepted_total == 2
    plan = sched.schedule()
    sched.update_rows([plan.decode[0].seq_id], [[7]])  # nothing accepted: back to 10 slots
    assert seq.num_computed == 10 and kv.num_tokens(row.seq_id) == 10
    free_before = kv.num_free_blocks
    sched.abort("a")
    assert kv.num_free_blocks == free_before + 3 and kv.num_used_blocks == 0
    assert kv.num_cached_blocks == 2  # only the two blocks of known tokens keep a hash


def test_new_rows_start_from_the_engines_recent_acceptance(monkeypatch):
    """Rule 2: after requests whose drafts all failed, a new row starts cold."""
    monkeypatch.setattr(RowDrafter, "propose", lambda self, t, k: [7] * k)
    monkeypatch.setattr(StepCostModel, "choose_width", lambda self, *a, **kw: 5)
    sched = Scheduler(KVCacheManager(64, 4), max_batch=4, prefill_chunk_tokens=64,
                      spec=SpecConfig(max_draft=4))
    for i in range(8):
        sched.add(SeqRequest(f"r{i}", list(range(10, 16)), GREEDY, 12))
        while sched.has_work:
            plan = sched.schedule()
            sched.update_rows(plan.sample_seq_ids, [[99]] * len(plan.sample_seq_ids))
    prior = sched.speculator.lookup_prior
    assert prior < 0.15 and sched.speculator.num_accepted_total == 0
    sched.add(SeqRequest("new", list(range(10, 16)), GREEDY, 12))
    plan = sched.schedule()
    sched.update_rows(plan.sample_seq_ids, [[99]])
    sched.schedule()
    (seq,) = sched.seqs.values()
    assert seq.drafter is not None and seq.drafter.alpha == prior and seq.drafter.is_cold


@pytest.mark.parametrize("max_rows, drafting", [(None, True), (3, False)])
def test_steps_of_many_rows_speculate_up_to_max_rows(monkeypatch, max_rows, drafting):
    """Rule 5: by default a step of 4 decoding rows drafts (rule 3 decides);
    above `max_rows` none does."""
    monkeypatch.setattr(RowDrafter, "propose", lambda self, t, k: [7] * k)
    monkeypatch.setattr(StepCostModel, "choose_width", lambda self, *a, **kw: 3)
    spec = SpecConfig(max_draft=4) if max_rows is None else SpecConfig(max_draft=4, max_rows=max_rows)
    sched = Scheduler(KVCacheManager(64, 4), max_batch=4, prefill_chunk_tokens=64, spec=spec)
    for i in range(4):
        sched.add(SeqRequest(f"r{i}", list(range(10, 16)), GREEDY, 12))
    plan = sched.schedule()  # the four prompts, each sampling its first token
    sched.update_rows(plan.sample_seq_ids, [[99]] * len(plan.sample_seq_ids))
    plan = sched.schedule()
    assert len(plan.decode) == 4
    assert all(row.draft == ([7, 7] if drafting else []) for row in plan.decode)


def test_the_draft_pool_holds_draft_rows_contexts_whatever_max_rows():
    """Rule 7: the draft model's KV pool is `draft_rows` full contexts, not `max_rows`."""
    spec = SpecConfig(max_rows=8, draft_rows=2)
    assert draft_pool_blocks(spec, num_blocks=1000, block_size=16, context_ceiling=160) == 20
    assert draft_pool_blocks(spec, num_blocks=12, block_size=16, context_ceiling=160) == 12


# -- exactness ----------------------------------------------------------------------


def test_prompt_lookup_on_a_copying_model_is_exact_and_accepted(copying, make_engine):
    engine = make_engine(copying)
    p = random_prompt(0, 10)
    prompt = p + greedy(copying, p, 30) + p
    outs = list(engine.submit(SeqRequest("a", prompt, GREEDY, 24)))
    assert [o.token_id for o in outs] == greedy(copying, prompt, 24)
    stats = engine.stats()
    drafted = sum(o.num_drafted or 0 for o in outs)
    accepted = sum(o.num_draft_accepted or 0 for o in outs)
    assert stats.draft_tokens_total == drafted and stats.draft_accepted_tokens_total == accepted
    assert accepted >= 12 and len(outs) - sum(1 for o in outs if o.num_drafted is not None) >= 12
    assert stats.num_blocks_used == 0


@pytest.mark.parametrize("pipeline", [False, True])
def test_greedy_with_drafts_equals_greedy_without(tiny, make_engine, oracle, pipeline):
    """Mixed batch: drafting rows, an opted-out row, chunked prefill, a prefix hit,
    n = 2, a stop token; every row equals mlx-lm's greedy run token for token."""
    engine = make_engine(tiny, prefill_chunk_tokens=5, pipeline=pipeline)
    prompts = [random_prompt(i, n) for i, n in enumerate((7, 23, 13, 30))]
    prompts.append(prompts[1][:17] + [5, 6])  # shares 4 blocks with prompts[1]
    refs = {tuple(p): greedy(tiny, p, 16) for p in prompts}
    oracle.references.update(refs)
    stop = refs[tuple(prompts[2])][9]
    requests = [SeqRequest("r0", prompts[0], GREEDY, 16),
                SeqRequest("r1", prompts[1], GREEDY, 16, n=2),
                SeqRequest("r2", prompts[2], GREEDY, 16, stop_token_ids=frozenset({stop})),
                SeqRequest("r3", prompts[3], GREEDY, 16, speculative=False)]
    streams = [engine.submit(r) for r in requests]
    results = [tokens(s) for s in streams]
    late = tokens(engine.submit(SeqRequest("r4", prompts[4], GREEDY, 16)))
    for req, rows in zip(requests, results):
        ref = refs[tuple(req.prompt_ids)]
        if req.stop_token_ids:
            ref = ref[:ref.index(stop) + 1]
        assert all(rows[i] == ref for i in range(req.n)), req.request_id
    assert late[0] == refs[tuple(prompts[4])]
    stats = engine.stats()
    assert 0 < stats.draft_accepted_tokens_total < stats.draft_tokens_total
    assert stats.prefix_hit_tokens_total >= 16 and stats.num_blocks_used == 0


def test_opted_out_rows_report_no_draft_usage(tiny, make_engine, oracle):
    engine = make_engine(tiny)
    p = random_prompt(3, 9)
    oracle.references[tuple(p)] = greedy(tiny, p, 8)
    off = list(engine.submit(SeqRequest("off", p, GREEDY, 8, speculative=False)))
    on = list(engine.submit(SeqRequest("on", p, GREEDY, 8)))
    assert all(o.num_drafted is None for o in off)
    assert [o.token_id for o in on] == [o.token_id for o in off]
    assert on[0].num_drafted is not None and sum(o.num_drafted or 0 for o in on) > 0


def test_grammar_rows_check_drafts_and_stay_exact(tiny, tiny_llama_dir, make_engine, oracle):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from frink_mlx.core.structured import GrammarSpec
    from frink_mlx.engine.constraints import GrammarCompiler

    tok = load_tokenizer(tiny_llama_dir)
    compiler = GrammarCompiler.for_tokenizer(tok, vocab_size=len(tok._tokenizer))
    spec = GrammarSpec("regex", "[a-m ]{4,40}")
    p = random_prompt(5, 11)
    plain = make_engine(tiny, spec=None)
    ref = tokens(plain.submit(SeqRequest("ref", p, GREEDY, 20,
                                          constraints=compiler.new_constraints(spec))))[0]
    # drafts: the reference, corrupted every third time (often into a forbidden token)
    oracle.references[tuple(p)] = ref + [2] * 8
    engine = make_engine(tiny)
    outs = list(engine.submit(SeqRequest("c", p, GREEDY, 20,
                                         constraints=compiler.new_constraints(spec))))
    assert [o.token_id for o in outs if o.token_id is not None] == ref
    assert sum(o.num_draft_accepted or 0 for o in outs) > 0
    assert outs[-1].error is None and engine.stats().num_blocks_used == 0


def test_seeded_sampled_rows_are_the_same_with_speculation_on_or_off(tiny, make_engine, oracle):
    """A draw is keyed by the row's output position (sampling.py rule 4), so drafts
    never change a seeded row's tokens; logprobs come with the accepted ones."""
    p = random_prompt(6, 8)
    params = SamplingParams(temperature=0.7, seed=11, logprobs=True, top_logprobs=2)
    off = list(make_engine(tiny, spec=None).submit(SeqRequest("off", p, params, 16, n=2)))
    oracle.references[tuple(p)] = [o.token_id for o in off if o.index == 0]
    engine = make_engine(tiny)
    on = list(engine.submit(SeqRequest("on", p, params, 16, n=2)))
    for index in (0, 1):
        assert [o.token_id for o in on if o.index == index] == \
            [o.token_id for o in off if o.index == index]
        assert np.allclose([o.logprob for o in on if o.index == index],
                           [o.logprob for o in off if o.index == index], atol=1e-3)
    assert all(o.logprob is not None and len(o.top_logprobs) == 2 for o in on)
    assert engine.stats().draft_accepted_tokens_total > 0


# -- the target distribution ----------------------------------------------------------


def _chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Upper tail of Pearson's statistic (Wilson-Hilferty); bins under 5 expected pooled."""
    keep = expected >= 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    if exp[-1] <= 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = len(exp) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("rank", [0, 3])
def test_verified_draws_follow_the_target_distribution(tiny, rank):
    """Over 6,000 seeds, a verify position keeps draft d as often as p(d), and the
    token it emits (d, or the draw that rejected it) follows the model's next-token
    distribution (top-k 20, temperature 1.5): a chi-square test."""
    logits = tiny.model(mx.array([random_prompt(9, 12)]))[:, -1, :].astype(mx.float32)
    params = SamplingParams(temperature=1.5, top_k=20)
    probs = np.array(mx.softmax(logits / params.temperature, axis=-1))[0]
    top = np.argsort(-probs)[:params.top_k]
    target = np.zeros_like(probs)
    target[top] = probs[top] / probs[top].sum()
    draft = int(top[rank])
    num = 6000
    positions = [s for seed in range(num)
                 for s in draft_samplers(RowSampler(params, seed, step=3), [draft])]
    out = sample(mx.repeat(logits, 2 * num, axis=0), positions)
    emitted = np.array(out.tokens)[0::2]  # position 0 of each row: checks the draft
    counts = np.bincount(emitted, minlength=probs.shape[0])
    assert counts[target == 0].sum() == 0
    assert abs(counts[draft] / num - target[draft]) < 0.03
    assert _chi_square_p(counts[top].astype(float), target[top] * num) > 1e-3


def test_an_aborted_verify_row_frees_every_block(tiny, make_engine, oracle):
    engine = make_engine(tiny)
    p = random_prompt(8, 14)
    oracle.references[tuple(p)] = greedy(tiny, p, 40)
    stream = engine.submit(SeqRequest("a", p, GREEDY, 40))
    seen = []
    for out in stream:
        seen.append(out.token_id)
        if len(seen) == 5:
            stream.abort()
    assert seen[:5] == oracle.references[tuple(p)][:5]
    for _ in range(200):
        if engine.stats().num_blocks_used == 0:
            break
        time.sleep(0.01)
    assert engine.stats().num_blocks_used == 0
