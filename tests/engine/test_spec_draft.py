"""The draft model (engine/speculative/ rule 7): exact greedy outputs, its own KV rolled back
and freed, acceptance when the draft is the target itself.

Tiny random-weight llamas (conftest.make_tiny_llama) share one tokenizer; the draft is
either the target's own weights (every draft is accepted) or a smaller, different
model (most drafts are rejected, so verification rolls back both KV pools in every
step shape: mixed batches, chunked prefill, n > 1, grammars, stop tokens, aborts).
"""

from __future__ import annotations

import time

import pytest
from engine_support import engines, greedy, loaded, random_prompt, tokens

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.engine import Engine
from frink_mlx.engine.speculative import SpecConfig
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
SPEC = SpecConfig(max_draft=4, max_rows=8, draft_step_cost=0.01)  # drafts look cheap


def _damp_mlps(model) -> None:
    for layer in model.model.layers:
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * 0.7


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return loaded(tiny_llama_dir)


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    from tests.conftest import make_tiny_llama

    return loaded(make_tiny_llama(tmp_path_factory.mktemp("draft"), seed=7,
                                  num_hidden_layers=1))


@pytest.fixture(scope="module")
def near_draft(tiny_llama_dir):
    """The target with its MLPs damped: agrees with it often, not always."""
    return loaded(tiny_llama_dir, _damp_mlps)


@pytest.fixture
def make_engine():
    yield from engines(SPEC)


def _settled(engine: Engine) -> dict[str, float]:
    for _ in range(200):
        stats = engine.stats()
        if stats.num_blocks_used == 0 and stats.extra.get("draft_kv_blocks_used") == 0:
            break
        time.sleep(0.01)
    return {"target": stats.num_blocks_used, "draft": stats.extra.get("draft_kv_blocks_used", -1)}


def test_a_draft_equal_to_the_target_is_accepted(tiny, make_engine):
    engine = make_engine(tiny, draft=tiny)
    p = random_prompt(1, 9)
    outs = list(engine.submit(SeqRequest("a", p, GREEDY, 24)))
    assert [o.token_id for o in outs] == greedy(tiny, p, 24)
    extra = engine.stats().extra
    drafted, accepted = extra["draft_model_tokens_total"], extra["draft_model_accepted_total"]
    assert drafted >= 12 and accepted / drafted > 0.95
    assert len(outs) - sum(1 for o in outs if o.num_drafted is not None) >= 12  # free tokens
    assert _settled(engine) == {"target": 0, "draft": 0}


@pytest.mark.parametrize("pipeline", [False, True])
@pytest.mark.parametrize("kind", ["near", "small"])
def test_greedy_with_a_draft_model_equals_greedy_without(tiny, small_draft, near_draft,
                                                         make_engine, pipeline, kind):
    """Mixed batch: drafting rows, an opted-out row, chunked prefill, n = 2, a stop
    token, prompts longer than one catch-up; each row equals mlx-lm's greedy run.
    The near draft is partly accepted; the small one has another KV geometry."""
    draft = near_draft if kind == "near" else small_draft
    engine = make_engine(tiny, draft=draft, prefill_chunk_tokens=5, pipeline=pipeline,
                         spec=SpecConfig(max_draft=4, max_rows=8, draft_chunk_tokens=8,
                                         draft_step_cost=0.01))
    prompts = [random_prompt(i, n) for i, n in enumerate((7, 23, 13, 30))]
    refs = {tuple(p): greedy(tiny, p, 16) for p in prompts}
    stop = refs[tuple(prompts[2])][9]
    requests = [SeqRequest("r0", prompts[0], GREEDY, 16),
                SeqRequest("r1", prompts[1], GREEDY, 16, n=2),
                SeqRequest("r2", prompts[2], GREEDY, 16, stop_token_ids=frozenset({stop})),
                SeqRequest("r3", prompts[3], GREEDY, 16, speculative=False)]
    results = [tokens(s) for s in [engine.submit(r) for r in requests]]
    for req, rows in zip(requests, results):
        ref = refs[tuple(req.prompt_ids)]
        if req.stop_token_ids:
            ref = ref[:ref.index(stop) + 1]
        assert all(rows[i] == ref for i in range(req.n)), req.request_id
    extra = engine.stats().extra
    assert extra["draft_model_tokens_total"] > 0
    if kind == "near":
        assert 0 < extra["draft_model_accepted_total"] < extra["draft_model_tokens_total"]
    assert _settled(engine) == {"target": 0, "draft": 0}


def test_draft_model_rows_with_a_grammar_stay_exact(tiny, near_draft, tiny_llama_dir,
                                                    make_engine):
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
    for draft in (tiny, near_draft):
        engine = make_engine(tiny, draft=draft)
        outs = list(engine.submit(SeqRequest("c", p, GREEDY, 20,
                                             constraints=compiler.new_constraints(spec))))
        assert [o.token_id for o in outs if o.token_id is not None] == ref
        assert outs[-1].error is None
        assert engine.stats().extra["draft_model_tokens_total"] > 0
        assert _settled(engine) == {"target": 0, "draft": 0}


def test_a_row_ended_mid_stream_frees_its_draft_kv(tiny, small_draft, make_engine):
    """What a stop string does (the handle ends the row after the matching token) and
    what a client abort does: both KV pools go back to zero."""
    engine = make_engine(tiny, draft=small_draft)
    p, q = random_prompt(8, 14), random_prompt(9, 10)
    ref = greedy(tiny, p, 40)
    stream = engine.submit(SeqRequest("a", p, GREEDY, 40, n=2))
    other = engine.submit(SeqRequest("b", q, GREEDY, 40))
    seen: list[int] = []
    for out in stream:
        if out.index == 0 and out.token_id is not None:
            seen.append(out.token_id)
            if len(seen) == 3:
                engine.abort("a", index=0)  # a stop string matched in row 0
            if len(seen) == 5:
                stream.abort()
    assert seen[:3] == ref[:3]
    other.abort()
    list(other)
    assert engine.stats().extra["draft_model_tokens_total"] > 0
    assert _settled(engine) == {"target": 0, "draft": 0}


def test_a_short_draft_pool_falls_back_without_failing(tiny, make_engine):
    """Two rows, room for one row's draft KV: the other decodes plainly (rule 7)."""
    engine = make_engine(tiny, draft=tiny, spec=SpecConfig(max_draft=4, max_rows=8,
                                                           draft_num_blocks=6,
                                                           draft_step_cost=0.01))
    prompts = [random_prompt(11, 9), random_prompt(12, 9)]
    streams = [engine.submit(SeqRequest(f"r{i}", p, GREEDY, 12)) for i, p in enumerate(prompts)]
    for p, stream in zip(prompts, streams):
        assert tokens(stream)[0] == greedy(tiny, p, 12)
    assert engine.stats().extra["draft_model_tokens_total"] > 0
    assert _settled(engine) == {"target": 0, "draft": 0}
