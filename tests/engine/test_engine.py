"""The Engine end to end: its thread, streams, validation, aborts, limits, failures."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import mlx.core as mx
import numpy as np
import pytest
from engine_support import engine_factory, greedy, loaded, random_prompt
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.types import SeqRequest
from frink_mlx.errors import ContextLengthExceeded, InvalidRequest, Overloaded

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return loaded(tiny_llama_dir)


@pytest.fixture
def make_engine(tiny):
    for make in engine_factory(num_blocks=64, prefill_chunk_tokens=8, context_ceiling=128):
        yield functools.partial(make, tiny)


@pytest.mark.parametrize("pipeline", [False, True])
def test_streams_match_generate_and_report_usage(tiny, make_engine, pipeline):
    engine = make_engine(pipeline=pipeline)
    prompts = [random_prompt(i, n) for i, n in enumerate((5, 17, 9))]
    streams = [engine.submit(SeqRequest(f"r{i}", p, GREEDY, 8)) for i, p in enumerate(prompts)]
    for p, stream in zip(prompts, streams):
        outs = list(stream)
        assert [o.token_id for o in outs] == greedy(tiny, p, 8)
        assert outs[0].num_prompt_tokens == len(p) and outs[0].num_cached_tokens == 0
        assert outs[-1].finish == "length" and all(o.finish is None for o in outs[:-1])
    again = list(engine.submit(SeqRequest("again", prompts[1], GREEDY, 8)))
    assert again[0].num_cached_tokens == 16
    assert [o.token_id for o in again] == greedy(tiny, prompts[1], 8)
    stats = engine.stats()
    assert stats.num_blocks_used == 0 and stats.prefix_hit_tokens_total == 16


def test_async_iteration_on_the_event_loop(tiny, make_engine):
    engine = make_engine()
    prompt = random_prompt(7, 6)

    async def run():
        stream = engine.submit(SeqRequest("a", prompt, GREEDY, 6))
        return [o.token_id async for o in stream]

    assert asyncio.run(run()) == greedy(tiny, prompt, 6)


def test_stop_token_ends_the_row_with_eos(tiny, make_engine):
    prompt = random_prompt(8, 6)
    want = greedy(tiny, prompt, 6)
    engine = make_engine()
    outs = list(engine.submit(SeqRequest("s", prompt, GREEDY, 6, stop_token_ids=frozenset({want[2]}))))
    assert [o.token_id for o in outs] == want[:want.index(want[2]) + 1]
    assert outs[-1].finish == "eos"


def test_submit_validates_synchronously(make_engine):
    engine = make_engine(context_ceiling=32, max_queue=2)
    with pytest.raises(ContextLengthExceeded) as err:
        engine.submit(SeqRequest("long", list(range(3, 35)), GREEDY, 4))
    assert (err.value.num_tokens, err.value.limit) == (33, 32)
    with pytest.raises(InvalidRequest):
        engine.submit(SeqRequest("empty", [], GREEDY, 4))
    with pytest.raises(InvalidRequest):
        engine.submit(SeqRequest("n", [5], GREEDY, 4, n=99))
    clamped = list(engine.submit(SeqRequest("clamp", list(range(3, 30)), GREEDY, 1000)))
    assert len(clamped) == 32 - 27 and clamped[-1].finish == "length"


def test_full_queue_is_overloaded(make_engine):
    engine = make_engine(start=False, max_queue=2)
    engine.submit(SeqRequest("a", [5, 6], GREEDY, 2))
    engine.submit(SeqRequest("b", [5, 6], GREEDY, 2))
    with pytest.raises(Overloaded) as err:
        engine.submit(SeqRequest("c", [5, 6], GREEDY, 2))
    assert err.value.retry_after_s >= 1.0


def test_abort_frees_blocks_within_a_step(make_engine):
    engine = make_engine()
    stream = engine.submit(SeqRequest("long", random_prompt(9, 10), GREEDY, 100))
    it = iter(stream)
    next(it), next(it)
    assert engine.stats().num_blocks_used > 0
    stream.abort()
    steps_at_abort = engine.stats().steps_total
    rest = list(it)
    assert rest[-1].finish == "abort"
    assert engine.stats().num_blocks_used == 0  # freed before the abort was reported
    assert engine.stats().steps_total - steps_at_abort <= 1  # at most the step being built


def test_queue_timeout_ends_the_stream_with_overloaded(make_engine):
    # The clock starts when the pool first refuses the waiter (hog running): 1 ms is
    # far less than the hog's 12 steps on any machine.
    engine = make_engine(start=False, num_blocks=28, queue_timeout_s=0.001)
    hog = engine.submit(SeqRequest("hog", random_prompt(10, 100), GREEDY, 12))   # 25, then 28 blocks
    waiter = engine.submit(SeqRequest("waiter", random_prompt(11, 20), GREEDY, 4))  # 5 blocks
    engine.start()  # both are queued before the first step, however slow this machine is
    with pytest.raises(Overloaded):
        list(waiter)
    assert list(hog)[-1].finish == "length"


def test_many_concurrent_requests_against_a_small_pool(make_engine):
    engine = make_engine(num_blocks=24, max_batch=8, context_ceiling=96, queue_timeout_s=60.0)
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], engine.stats().num_blocks_used)
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    streams = [engine.submit(SeqRequest(f"c{i}", random_prompt(100 + i, 20 + i % 7), GREEDY, 40))
               for i in range(32)]
    results = []
    for stream in streams:
        try:
            results.append(list(stream)[-1].finish)
        except Overloaded:
            results.append("overloaded")
    stop.set()
    watcher.join()
    assert all(r in ("length", "eos", "overloaded") for r in results)
    assert results.count("length") + results.count("eos") >= 8
    assert peak[0] <= 24 and engine.stats().num_blocks_used == 0


class _OnlyToken:
    def __init__(self, token, fail=False):
        self.token, self.fail, self.seen = token, fail, []

    def allowed_mask(self):
        if self.fail:
            raise RuntimeError("matcher exploded")
        mask = np.zeros(500, dtype=bool)
        mask[self.token] = True
        return mask

    def accept(self, token_id):
        self.seen.append(token_id)
        return token_id == self.token

    def is_done(self):
        return len(self.seen) >= 3

    @property
    def error(self):
        return None


def test_row_constraints_mask_and_finish(make_engine):
    engine = make_engine()
    constraint = _OnlyToken(42)
    outs = list(engine.submit(SeqRequest("c", random_prompt(12, 5), GREEDY, 10, constraints=[constraint])))
    assert [o.token_id for o in outs] == [42, 42, 42] and outs[-1].finish == "eos"


def test_a_failing_step_errors_its_rows_and_the_engine_keeps_serving(tiny, make_engine):
    engine = make_engine()
    outs = list(engine.submit(SeqRequest("bad", random_prompt(13, 5), GREEDY, 5,
                                         constraints=[_OnlyToken(1, fail=True)])))
    assert outs[-1].finish == "error" and "matcher exploded" in outs[-1].error
    prompt = random_prompt(14, 5)
    assert [o.token_id for o in engine.submit(SeqRequest("ok", prompt, GREEDY, 4))] == \
        greedy(tiny, prompt, 4)
    assert engine.stats().num_blocks_used == 0


def test_logprobs_logit_bias_and_penalties(make_engine):
    engine = make_engine()
    prompt = random_prompt(15, 6)
    params = SamplingParams(temperature=0, logprobs=True, top_logprobs=3, logit_bias={77: 100.0})
    outs = list(engine.submit(SeqRequest("lp", prompt, params, 3)))
    assert [o.token_id for o in outs] == [77, 77, 77]
    for o in outs:
        assert o.logprob is not None and o.logprob <= 0.0
        assert [t.token_id for t in o.top_logprobs][0] == 77 and len(o.top_logprobs) == 3
    # penalties and bias match mlx-lm's own logits processors, step by step
    params = SamplingParams(temperature=0, logit_bias={77: 1.5}, presence_penalty=1.5,
                            frequency_penalty=0.5, repetition_penalty=1.3, penalty_context_size=16)
    tokens = [o.token_id for o in engine.submit(SeqRequest("pp", prompt, params, 8))]
    processors = make_logits_processors(
        logit_bias={77: 1.5}, repetition_penalty=1.3, repetition_context_size=16,
        presence_penalty=1.5, presence_context_size=16,
        frequency_penalty=0.5, frequency_context_size=16)
    want = [int(t) for t, _ in generate_step(mx.array(prompt), engine.loaded.model, max_tokens=8,
                                             logits_processors=processors)]
    assert tokens == want


def test_batching_off_still_serves_everyone(tiny, make_engine):
    engine = make_engine(batching=False)
    prompts = [random_prompt(20 + i, 4 + i) for i in range(3)]
    streams = [engine.submit(SeqRequest(f"b{i}", p, GREEDY, 5)) for i, p in enumerate(prompts)]
    for p, stream in zip(prompts, streams):
        assert [o.token_id for o in stream] == greedy(tiny, p, 5)


def test_shutdown_aborts_what_is_left(make_engine):
    engine = make_engine()
    stream = engine.submit(SeqRequest("forever", random_prompt(30, 5), GREEDY, 120))
    it = iter(stream)
    next(it)
    engine.shutdown(0.0)
    assert list(it)[-1].finish in ("abort", "length")
    with pytest.raises(Overloaded):
        engine.submit(SeqRequest("late", [5], GREEDY, 1))


def test_second_turn_reuses_the_first_turns_prompt_and_answer(tiny, make_engine):
    engine = make_engine(block_size=4)
    turn1 = random_prompt(40, 11)
    answer = [o.token_id for o in engine.submit(SeqRequest("t1", turn1, GREEDY, 9))]
    turn2 = turn1 + answer + random_prompt(41, 5)
    outs = list(engine.submit(SeqRequest("t2", turn2, GREEDY, 4)))
    # every full block whose K/V exists: the last answer token was never fed back
    assert outs[0].num_cached_tokens == (len(turn1) + len(answer) - 1) // 4 * 4 == 16
    assert [o.token_id for o in outs] == greedy(tiny, turn2, 4)


def test_n_sampled_rows_differ_and_repeat_with_the_seed(make_engine):
    engine = make_engine()
    prompt = random_prompt(50, 9)
    params = SamplingParams(temperature=1.0, seed=11)

    def rows():
        got: dict[int, list[int]] = {}
        for o in engine.submit(SeqRequest(f"n-{time.monotonic_ns()}", prompt, params, 8, n=3)):
            got.setdefault(o.index, []).append(o.token_id)
        return got

    first = rows()
    assert sorted(first) == [0, 1, 2] and all(len(v) == 8 for v in first.values())
    assert len({tuple(v) for v in first.values()}) == 3
    assert rows() == first
    assert engine.stats().num_blocks_used == 0
