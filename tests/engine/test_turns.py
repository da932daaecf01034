"""engine/turns.py and gate.py rules 6-7: a contended prefill runs a few layers per gate
turn, gives the same tokens as an unsliced one, and lets the other engine step between."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from engine_support import engine_factory, greedy, loaded, random_prompt, tokens

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.engine import Engine
from frink_mlx.engine.gate import ACTIVE_SLACK_S, ACTIVE_STEPS, DecodeGate
from frink_mlx.engine.turns import GROWTH, PrefillSlicer
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)


def test_yield_step_lets_the_others_in_until_one_of_them_ends_a_step() -> None:
    gate, order = DecodeGate(), []
    holding, other_done = threading.Event(), threading.Event()

    def other() -> None:
        holding.wait(10)
        with gate:                 # queued behind the holder
            order.append("other dispatch")
        with gate:
            order.append("other read")
        gate.note_step()
        other_done.set()

    thread = threading.Thread(target=other)
    thread.start()
    with gate:
        with gate:                 # depth 2: the yield keeps it
            holding.set()
            time.sleep(0.05)       # the other thread is queued by now
            gate.yield_step(timeout_s=10.0)
            order.append("back")
            assert other_done.wait(10)
    thread.join(10)
    assert order == ["other dispatch", "other read", "back"]
    assert not gate.contended(window_s=0.0)


def test_yield_step_gives_up_waiting_after_its_timeout_and_needs_the_gate() -> None:
    gate = DecodeGate()
    with pytest.raises(RuntimeError, match="does not hold"):
        gate.yield_step(0.01)
    with gate:
        assert gate.yield_step(10.0) is False  # nobody queued: it keeps the gate
    done = threading.Event()

    def ask_once() -> None:
        with gate:
            done.set()

    with gate:
        thread = threading.Thread(target=ask_once)
        thread.start()
        time.sleep(0.05)
        began = time.perf_counter()
        assert gate.yield_step(0.1) is True   # it let the other in; nobody ended a step
        assert done.is_set() and 0.09 < time.perf_counter() - began < 5.0
    thread.join(10)


def test_peer_step_is_the_other_threads_mean_held_time() -> None:
    gate = DecodeGate()

    def steps(n: int, hold_s: float) -> None:
        for _ in range(n):
            with gate:
                time.sleep(hold_s)
            gate.note_step()

    thread = threading.Thread(target=steps, args=(3, 0.02))
    thread.start()
    thread.join(10)
    steps(2, 0.0)
    assert gate.peer_step_s() == pytest.approx(0.02, rel=0.5)
    time.sleep(ACTIVE_STEPS * 0.04 + ACTIVE_SLACK_S)
    assert gate.peer_step_s() is None  # it stopped stepping: no longer a peer to yield to


class FakeGate:
    def __init__(self, peer: float | None) -> None:
        self.peer, self.yields = peer, 0

    def yield_step(self, timeout_s: float) -> bool:
        self.yields += 1
        return True

    def peer_step_s(self) -> float | None:
        return self.peer


def test_chunk_size_fits_the_budget_within_its_bounds() -> None:
    slicer = PrefillSlicer(FakeGate(None), min_tokens=16, max_tokens=256)
    assert slicer.chunk_tokens() == 16            # nothing measured, no peer
    slicer.gate = FakeGate(0.1)
    slicer.layer_token_s = 1e-3                   # 60 tokens per layer fit 0.6 of 0.05 s
    assert slicer.chunk_tokens() == int(GROWTH * 16)  # grown at most 1.5x the last chunk
    slicer._last_tokens = 200
    assert slicer.chunk_tokens() == 30
    slicer.layer_token_s = 1e-6
    assert slicer.chunk_tokens() == 256
    slicer.layer_token_s = 1.0
    assert slicer.chunk_tokens() == 16


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("turns")
    return tuple(loaded(make_tiny_llama(root / name, seed=seed, num_hidden_layers=4))
                 for seed, name in enumerate(["a", "b"]))


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    yield from engine_factory(num_blocks=512, prefill_chunk_tokens=64, context_ceiling=1024,
                              shared_prefill_tokens=8, pipeline=False)


def test_a_prefill_next_to_another_models_streams_is_sliced_and_exact(two_models,
                                                                      make_engine) -> None:
    """Model A decodes four streams while model B prefills a 600-token prompt on the same
    gate: B's steps run a few layers per turn (the slicer yielded), A kept stepping in
    between, and both answers equal each model's own greedy output."""
    model_a, model_b = two_models
    gate = DecodeGate()
    a, b = make_engine(model_a, gate=gate), make_engine(model_b, gate=gate)
    prompts = [random_prompt(i, 12) for i in range(4)]
    streams = [a.submit(SeqRequest(f"a{i}", p, GREEDY, 120)) for i, p in enumerate(prompts)]
    first = next(iter(streams[0]))  # A is decoding
    long_prompt = random_prompt(99, 600)
    answer_b = tokens(b.submit(SeqRequest("b", long_prompt, GREEDY, 4)))
    answers_a = [tokens(s) for s in streams[1:]]
    rest_a0 = tokens(streams[0])
    slicer = b._loop.slicer
    assert slicer is not None and slicer.turns_total > 0 and slicer.layer_token_s is not None
    assert b.stats().extra["sliced_prefill_turns_total"] == slicer.turns_total  # /metrics
    assert answer_b == {0: greedy(model_b, long_prompt, 4)}
    for prompt, answer in zip(prompts[1:], answers_a):
        assert answer == {0: greedy(model_a, prompt, 120)}
    assert [first.token_id] + rest_a0[0] == greedy(model_a, prompts[0], 120)


def test_a_prefill_right_after_another_models_request_ended_is_not_sliced(two_models,
                                                                        make_engine) -> None:
    """The editor's alternation: model A answered a moment ago and is idle now; B's prompt
    must not wait on A's steps that never come (gate rule 7: A no longer steps)."""
    model_a, model_b = two_models
    gate = DecodeGate()
    a, b = make_engine(model_a, gate=gate), make_engine(model_b, gate=gate)
    tokens(a.submit(SeqRequest("a", random_prompt(1, 12), GREEDY, 8)))
    time.sleep(0.05)
    prompt = random_prompt(2, 200)
    assert tokens(b.submit(SeqRequest("b", prompt, GREEDY, 4))) == {0: greedy(model_b, prompt, 4)}
    slicer = b._loop.slicer
    assert slicer is not None and slicer.turns_total == 0
