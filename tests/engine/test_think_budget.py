"""Thinking budgets (engine/think_budget.py): the think-end marker is forced
after `budget` tokens inside an open think block, then the row goes on."""

from __future__ import annotations

import types

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.think_budget import ThinkBudget, with_think_budget
from frink_mlx.engine.types import SeqRequest
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

END = [300, 301]
START = [290]


def _forced(mask: np.ndarray | None) -> int | None:
    if mask is None:
        return None
    allowed = np.flatnonzero(mask)
    assert len(allowed) == 1
    return int(allowed[0])


def test_forces_the_end_marker_after_the_budget_when_the_prompt_opened_the_block() -> None:
    tb = ThinkBudget(3, think_start_ids=START, think_end_ids=END, opens_inside=True)
    for token in (10, 11, 12):
        assert tb.allowed_mask() is None
        assert tb.accept(token)
    assert _forced(tb.allowed_mask()) == 300
    tb.accept(300)
    assert _forced(tb.allowed_mask()) == 301
    tb.accept(301)
    for token in (13, 14, 15, 16, 17):  # the answer: never capped
        assert tb.allowed_mask() is None
        tb.accept(token)


def test_a_block_the_model_opens_gets_the_budget_and_one_it_closes_resets() -> None:
    tb = ThinkBudget(2, think_start_ids=START, think_end_ids=END, opens_inside=False)
    for token in (5, 6, 7, 8):  # outside any block: free
        assert tb.allowed_mask() is None
        tb.accept(token)
    tb.accept(290)  # <think>
    tb.accept(9)
    assert tb.allowed_mask() is None
    tb.accept(300)
    tb.accept(301)  # the model closed it itself (2 tokens inside: at the budget, not over)
    assert tb.allowed_mask() is None
    tb.accept(290)
    tb.accept(20)
    tb.accept(21)
    assert _forced(tb.allowed_mask()) == 300


def test_an_inner_constraint_sees_every_token_and_masks_when_nothing_is_forced() -> None:
    class Inner:
        error = None

        def __init__(self) -> None:
            self.seen: list[int] = []

        def allowed_mask(self) -> np.ndarray:
            return np.ones(4, dtype=bool)

        def accept(self, token_id: int) -> bool:
            self.seen.append(token_id)
            return True

        def is_done(self) -> bool:
            return False

    inner = Inner()
    [tb] = with_think_budget([inner], 1, 1, think_start_ids=START, think_end_ids=END,
                             opens_inside=True)
    assert tb.allowed_mask() is not None and tb.allowed_mask().shape == (4,)
    tb.accept(1)
    assert _forced(tb.allowed_mask()) == 300
    tb.accept(300)
    tb.accept(301)
    assert inner.seen == [1, 300, 301]
    assert tb.allowed_mask().shape == (4,)


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


@pytest.mark.parametrize("params", [SamplingParams(temperature=0),
                                    SamplingParams(temperature=1.0, seed=4)])
def test_the_engine_emits_the_forced_marker_then_decodes_on(engine: Engine, params) -> None:
    prompt = [17, 201, 33, 90, 5, 250, 61, 7, 140]
    free = [o.token_id for o in engine.submit(SeqRequest("free", prompt, params, 12))]
    rows = with_think_budget(None, 2, 5, think_start_ids=START, think_end_ids=END,
                             opens_inside=True)
    got: dict[int, list[int]] = {0: [], 1: []}
    for o in engine.submit(SeqRequest("budget", prompt, params, 12, n=2, constraints=rows)):
        got[o.index].append(o.token_id)
    assert got[0][:5] == free[:5]
    for row in got.values():
        assert len(row) == 12 and row[5:7] == END
    assert engine.stats().num_blocks_used == 0
