"""Greedy parity: every row of a continuously batched run equals mlx_lm run alone.

Rows join at different steps, prompts are chunked (small chunk sizes force
it), and later requests hit the prefix cache; each row must still produce
exactly `mlx_lm.generate_step`'s greedy tokens for its prompt.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.kv.paged import PagedKVStore, model_kv_geometry
from frink_mlx.engine.runner import Runner
from frink_mlx.engine.sampling import RowSampler
from frink_mlx.engine.scheduler import Scheduler
from frink_mlx.engine.types import SeqRequest
from frink_mlx.settings import Settings

NUM_TOKENS = 10
# This machine's backend with unsplit matmuls: on the CPU backend, our kernels alone.
UNSPLIT = select_backend(Settings(cpu_matmul_parts=1).backend_config())


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    return model


def reference(model, prompt, num_tokens=NUM_TOKENS):
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=num_tokens)]


def drive(model, arrivals, *, block_size=4, num_blocks=96, chunk=5, max_batch=8, pipelined=True,
          backend=UNSPLIT):
    """Run scheduler + runner by hand. arrivals: {step: [SeqRequest]}; returns {request_id: {row: tokens}}."""
    layers, heads, head_dim = model_kv_geometry(model)
    store = PagedKVStore(num_layers=layers, num_blocks=num_blocks, block_size=block_size,
                         n_kv_heads=heads, head_dim=head_dim, dtype=mx.float32)
    sched = Scheduler(KVCacheManager(num_blocks, block_size), max_batch=max_batch,
                      prefill_chunk_tokens=chunk)
    runner = Runner(model, store, backend.prepare_decoder(model))
    samplers: dict[int, RowSampler] = {}
    outs: dict[str, dict[int, list[int]]] = {}
    pending = None

    def deliver(step):
        rows = step.read()
        for seq_id, row in zip(step.seq_ids, rows):
            seq = sched.seqs.get(seq_id)
            if seq is not None and seq.num_pending:
                by_index = outs.setdefault(seq.group.request.request_id, {})
                by_index.setdefault(seq.index, []).append(row.token_id)
        sched.update(step.seq_ids, [r.token_id for r in rows])

    step = 0
    while step < 500 and (sched.has_work or pending is not None or any(s >= step for s in arrivals)):
        for req in arrivals.get(step, []):
            group = sched.add(req)
            for seq in group.seqs:
                samplers[seq.seq_id] = RowSampler(req.sampling, (req.sampling.seed or 0) + seq.index)
        plan = sched.schedule()
        result = runner.run(plan, samplers) if not plan.is_empty else None
        if not pipelined and result is not None:
            deliver(result)
            result = None
        if pending is not None:
            deliver(pending)
        pending = result
        step += 1
    assert sched.kv.num_used_blocks == 0
    return outs


def _prompts(seed, lengths):
    rng = random.Random(seed)
    return [[rng.randrange(3, 380) for _ in range(n)] for n in lengths]


GREEDY = SamplingParams(temperature=0)


@pytest.mark.parametrize("pipelined", [True, False])
def test_rows_joining_at_different_steps_match_generate(tiny, pipelined):
    prompts = _prompts(1, (7, 3, 13, 30, 21, 1))
    joins = [0, 0, 2, 3, 6, 9]
    arrivals: dict[int, list[SeqRequest]] = {}
    for i, (p, at) in enumerate(zip(prompts, joins)):
        arrivals.setdefault(at, []).append(SeqRequest(f"r{i}", p, GREEDY, NUM_TOKENS))
    outs = drive(tiny, arrivals, pipelined=pipelined)
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"][0] == reference(tiny, p), f"row r{i}"


@pytest.mark.parametrize("parts", [2, 3])
def test_matmuls_split_over_streams_keep_parity(tiny, parts):
    """backend/cpu/split.py: the runner's forward with each product cut over `parts` CPU streams."""
    backend = select_backend(Settings(cpu_matmul_parts=parts).backend_config(), name="cpu")
    prompts = _prompts(7, (7, 3, 13, 30))
    arrivals: dict[int, list[SeqRequest]] = {}
    for i, (p, at) in enumerate(zip(prompts, [0, 0, 2, 5])):
        arrivals.setdefault(at, []).append(SeqRequest(f"r{i}", p, GREEDY, NUM_TOKENS))
    outs = drive(tiny, arrivals, backend=backend)
    up_proj = tiny.model.layers[0].mlp.up_proj  # 128 rows: one range per part
    assert len(up_proj._frink_ranges.parts) == parts
    for i, p in enumerate(prompts):
        assert outs[f"r{i}"][0] == reference(tiny, p), f"row r{i}"


def test_prefix_hits_keep_parity(tiny):
    shared = _prompts(2, (17,))[0]
    a, b = shared + [5, 6, 7], shared + [9, 10]
    arrivals = {0: [SeqRequest("a", a, GREEDY, NUM_TOKENS)],
                14: [SeqRequest("b", b, GREEDY, NUM_TOKENS), SeqRequest("a2", a, GREEDY, NUM_TOKENS)]}
    outs = drive(tiny, arrivals, chunk=64)
    assert outs["a"][0] == outs["a2"][0] == reference(tiny, a)
    assert outs["b"][0] == reference(tiny, b)


def test_prefix_hit_inside_one_forward_keeps_parity(tiny):
    """Row y reads blocks that row x writes in the very same prefill call."""
    shared = _prompts(6, (13,))[0]
    x, y = shared + [4], shared + [8, 9, 10]
    outs = drive(tiny, {0: [SeqRequest("x", x, GREEDY, NUM_TOKENS), SeqRequest("y", y, GREEDY, NUM_TOKENS)]},
                 chunk=64)
    assert outs["x"][0] == reference(tiny, x)
    assert outs["y"][0] == reference(tiny, y)


def test_n_rows_share_the_prompt_and_match_generate(tiny):
    prompt = _prompts(3, (14,))[0]
    outs = drive(tiny, {0: [SeqRequest("n3", prompt, GREEDY, NUM_TOKENS, n=3)]}, chunk=6)
    want = reference(tiny, prompt)
    assert outs["n3"] == {0: want, 1: want, 2: want}


def test_same_seed_same_tokens_whatever_the_batch(tiny):
    prompt = _prompts(4, (9,))[0]
    hot = SamplingParams(temperature=1.0, top_k=50, seed=1234)
    alone = drive(tiny, {0: [SeqRequest("s", prompt, hot, NUM_TOKENS)]})["s"][0]
    others = [SeqRequest(f"o{i}", p, GREEDY, NUM_TOKENS) for i, p in enumerate(_prompts(5, (4, 11)))]
    crowded = drive(tiny, {0: others, 1: [SeqRequest("s", prompt, hot, NUM_TOKENS)]})["s"][0]
    other_seed = drive(tiny, {0: [SeqRequest("s", prompt, SamplingParams(temperature=1.0, top_k=50, seed=99),
                                             NUM_TOKENS)]})["s"][0]
    assert alone == crowded
    assert alone != other_seed


def _pointer(a):
    import numpy as np

    return np.asarray(memoryview(a)).__array_interface__["data"][0]


def test_pools_stay_in_place_when_decode_and_prefill_share_a_step(tiny):
    """kv/paged.py rule 1, in the step shape most likely to break it."""
    layers, heads, head_dim = model_kv_geometry(tiny)
    store = PagedKVStore(num_layers=layers, num_blocks=64, block_size=4, n_kv_heads=heads,
                         head_dim=head_dim, dtype=mx.float32)
    sched = Scheduler(KVCacheManager(64, 4), max_batch=4, prefill_chunk_tokens=6)
    runner = Runner(tiny, store, UNSPLIT.prepare_decoder(tiny))
    samplers = {}
    for i, n in enumerate((5, 17)):
        for seq in sched.add(SeqRequest(f"r{i}", _prompts(9 + i, (n,))[0], GREEDY, 4)).seqs:
            samplers[seq.seq_id] = RowSampler(GREEDY, 0)
    before = [_pointer(a) for a in store.arrays()]
    pending, mixed = None, 0
    while sched.has_work or pending is not None:
        plan = sched.schedule()
        mixed += bool(plan.decode and plan.prefill)
        result = runner.run(plan, samplers) if not plan.is_empty else None
        if pending is not None:
            sched.update(pending.seq_ids, [r.token_id for r in pending.read()])
        pending = result
        mx.eval(store.arrays())
        assert [_pointer(a) for a in store.arrays()] == before
    assert mixed >= 2
