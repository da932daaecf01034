"""Per-row abort: one choice of an n > 1 request ends, its siblings go on.

A choice that matches a stop string is done; `SeqStream.abort(index)` ends
that engine row within one step and frees its blocks, while the other rows
keep decoding exactly as they would have alone (row i of a seeded request
samples with seed + i, so a solo request with that seed is its reference).
"""

from __future__ import annotations

import types

import mlx.core as mx
import pytest
from mlx_lm import load

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

PROMPT = [17, 201, 33, 90, 5, 250, 61, 7, 140]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    loaded = types.SimpleNamespace(model=model, dtype=mx.float32, context_length=2048)
    config = EngineConfig(block_size=4, num_blocks=64, max_batch=8, prefill_chunk_tokens=16,
                          batching=True, context_ceiling=128, max_queue=64,
                          queue_timeout_s=30.0, generation=1)
    engine = Engine(loaded, resolve_engine_config(config, loaded, BACKEND), DecodeGate(), BACKEND)
    engine.start()
    yield engine
    engine.shutdown(1.0)


def _solo(engine: Engine, seed: int) -> list[int]:
    params = SamplingParams(temperature=1.0, seed=seed)
    return [o.token_id for o in engine.submit(SeqRequest(f"solo-{seed}", PROMPT, params,
                                                         MAX_TOKENS))]


def test_one_row_aborts_and_frees_its_blocks_while_the_others_run_on(engine: Engine) -> None:
    solo = {i: _solo(engine, 11 + i) for i in range(3)}
    assert len({tuple(v) for v in solo.values()}) == 3
    before = engine.stats().generated_tokens_total
    params = SamplingParams(temperature=1.0, seed=11)
    stream = engine.submit(SeqRequest("trio", PROMPT, params, MAX_TOKENS, n=3))
    rows: dict[int, list] = {0: [], 1: [], 2: []}
    seq_ids: dict[int, int] = {}
    for out in stream:
        rows[out.index].append(out)
        if out.index == 1 and len(rows[1]) == 2:
            seq_ids = {s.index: s.seq_id for s in list(engine.scheduler.seqs.values())
                       if s.group.request.request_id == "trio"}
            stream.abort(1)
        if out.index == 1 and out.finish == "abort":
            assert seq_ids[1] not in engine.kv  # freed before the abort was reported
    row1 = rows[1]
    assert row1[-1].finish == "abort"
    sampled = [o.token_id for o in row1 if o.token_id is not None]
    assert 2 <= len(sampled) <= 4  # the abort lands within a step (one more may be in flight)
    assert sampled == solo[1][:len(sampled)]
    for i in (0, 2):
        assert [o.token_id for o in rows[i]] == solo[i]
        assert rows[i][-1].finish == "length"
    stats = engine.stats()
    assert stats.generated_tokens_total - before == 2 * MAX_TOKENS + len(sampled)
    assert stats.num_blocks_used == 0


def test_abort_without_index_still_ends_every_row(engine: Engine) -> None:
    params = SamplingParams(temperature=1.0, seed=3)
    stream = engine.submit(SeqRequest("all", PROMPT, params, 100, n=2))
    finishes = {}
    for out in stream:
        if out.finish is None and not finishes and out.index == 0:
            stream.abort()
        if out.finish is not None:
            finishes[out.index] = out.finish
    assert finishes == {0: "abort", 1: "abort"}
    assert engine.stats().num_blocks_used == 0
