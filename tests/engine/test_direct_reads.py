"""Decode reading the keys where they lie (kv/paged.py rule 7, CPU backend) stays token-exact.

The CPU kernels' thresholds are lowered so the tiny model's rows (tens of tokens, blocks
of 4) take the in-place read, with runs short enough that some of each row's blocks are
sliced and the rest gathered, their columns cut over the matmuls' side streams, beside
short rows batched over their own gather: every row
must still equal mlx-lm's greedy run alone, through concurrent rows (their decode blocks
interleave in the pool), prefix hits, n = 2 forks, rows read together over the blocks
they share (kv/reads.py rule 5) and speculation's verify rows.
"""

from __future__ import annotations

import pytest
from engine_support import BACKEND, engine_factory, engines, greedy, loaded, random_prompt, tokens

from frink_mlx.backend.cpu.split import auto_parts
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.speculative import RowDrafter, SpecConfig
from frink_mlx.engine.types import SeqRequest

pytestmark = pytest.mark.skipif(BACKEND.name != "cpu", reason="the CPU backend's kernels")

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return loaded(tiny_llama_dir)


@pytest.fixture
def direct(monkeypatch):
    """Counts the rows read in place (and the sliced runs) while the test runs."""
    from frink_mlx.backend.cpu import kernels, segments

    monkeypatch.setattr(kernels, "MIN_SCORES", 1)
    monkeypatch.setattr(segments, "SPLIT_COLUMNS", 8)  # rows cut over the matmuls' streams
    monkeypatch.setattr(kernels, "DIRECT_MIN_TOKENS", 20)
    monkeypatch.setattr(kernels, "DIRECT_MAX_RUNS", 2)
    monkeypatch.setattr(kernels, "DIRECT_MIN_RUN_BLOCKS", 2)
    seen = {"rows": 0, "segments": 0, "batched": 0, "streams": 0, "shared": 0}
    real = kernels.segment_attention
    real_paged = kernels.paged_attention

    def counting(queries, keys, values, scale, bias, streams=()):
        seen["rows"] += 1
        seen["segments"] = max(seen["segments"], len(keys))
        seen["streams"] = max(seen["streams"], len(streams))
        return real(queries, keys, values, scale, bias, streams)

    def counting_paged(queries, read, scale):
        seen["batched"] += len(read.batched)
        seen["shared"] = max([seen["shared"], *(len(seg.rows) for seg in read.direct)])
        return real_paged(queries, read, scale)

    monkeypatch.setattr(kernels, "segment_attention", counting)
    monkeypatch.setattr(kernels, "paged_attention", counting_paged)
    return seen


@pytest.fixture
def make_engine():
    yield from engine_factory(num_blocks=256, prefill_chunk_tokens=16, context_ceiling=512,
                              pipeline=False)


def test_concurrent_rows_prefix_hits_and_forks_equal_greedy(tiny, make_engine, direct):
    engine = make_engine(tiny)
    prompts = [random_prompt(10 + i, n) for i, n in enumerate((41, 9, 27, 60))]
    prompts.append(prompts[3][:48] + [7, 8, 9])  # 12 blocks from the prefix cache
    requests = [SeqRequest(f"r{i}", p, GREEDY, 14, n=2 if i == 2 else 1)
                for i, p in enumerate(prompts[:4])]
    results = [tokens(s) for s in [engine.submit(r) for r in requests]]
    late = tokens(engine.submit(SeqRequest("late", prompts[4], GREEDY, 14)))
    for req, rows in zip(requests, results):
        ref = greedy(tiny, req.prompt_ids, 14)
        assert all(rows[i] == ref for i in range(req.n)), req.request_id
    assert late[0] == greedy(tiny, prompts[4], 14)
    assert direct["rows"] > 0 and direct["segments"] >= 2 and direct["batched"] > 0
    assert direct["streams"] == auto_parts(BACKEND.matmul_parts) - 1  # one per other core
    assert engine.stats().prefix_hit_tokens_total >= 48


def test_verify_rows_read_in_place_equal_greedy(tiny, direct, monkeypatch):
    """An oracle drafts the reference with every third draft corrupted (test_spec.py's)."""
    prompts = [random_prompt(30 + i, n) for i, n in enumerate((33, 25, 50))]
    refs = {tuple(p): greedy(tiny, p, 16) for p in prompts}

    def propose(self, toks, k):
        for prompt, ref in refs.items():
            if tuple(toks[:len(prompt)]) == prompt:
                draft = list(ref[len(toks) - len(prompt):][:k])
                if draft and len(toks) % 3 == 0:
                    draft[len(toks) % len(draft)] = (draft[len(toks) % len(draft)] + 1) % 380 + 3
                return draft
        return []

    monkeypatch.setattr(RowDrafter, "propose", propose)
    for make in engines(SpecConfig(max_draft=6, ngram_max=3)):
        engine = make(tiny)
        streams = [engine.submit(SeqRequest(f"s{i}", p, GREEDY, 16)) for i, p in enumerate(prompts)]
        for p, stream in zip(prompts, streams):
            assert tokens(stream)[0] == refs[tuple(p)]
        stats = engine.stats()
        assert 0 < stats.draft_accepted_tokens_total < stats.draft_tokens_total
    assert direct["rows"] > 0


def test_rows_over_one_cached_prompt_read_its_blocks_together_and_equal_greedy(
        tiny, make_engine, direct):
    """kv/reads.py rule 5: four requests over one 64-token prompt (the first one's blocks
    cached for the others), two of them n = 2, decode side by side over the shared blocks;
    the rows are read as groups and every row equals mlx-lm's greedy run alone."""
    engine = make_engine(tiny)
    base = random_prompt(77, 64)
    assert tokens(engine.submit(SeqRequest("warm", base + [5], GREEDY, 2)))[0] == \
        greedy(tiny, base + [5], 2)
    prompts = [base + tail for tail in ([5], [6, 7], [8], [9, 10, 11])]
    requests = [SeqRequest(f"s{i}", p, GREEDY, 12, n=2 if i % 2 else 1)
                for i, p in enumerate(prompts)]
    streams = [engine.submit(r) for r in requests]
    for req, rows in zip(requests, [tokens(s) for s in streams]):
        ref = greedy(tiny, req.prompt_ids, 12)
        assert all(rows[i] == ref for i in range(req.n)), req.request_id
    assert direct["shared"] >= 4      # at least four rows read as one
    assert engine.stats().prefix_hit_tokens_total >= 4 * 64
