"""SeqStream.admitted(): returns once the engine starts the request, raises
what refused it before (engine.py failure rule 2), loses no output."""

from __future__ import annotations

import asyncio
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
from frink_mlx.errors import InvalidRequest, Overloaded
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

GREEDY = SamplingParams(temperature=0)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    return types.SimpleNamespace(model=model, dtype=mx.float32, context_length=2048)


def _engine(tiny, **overrides) -> Engine:
    cfg = dict(block_size=4, num_blocks=28, max_batch=8, prefill_chunk_tokens=8, batching=True,
               context_ceiling=112, max_queue=64, queue_timeout_s=0.05, generation=1)
    cfg.update(overrides)
    return Engine(tiny, resolve_engine_config(EngineConfig(**cfg), tiny, BACKEND), DecodeGate(), BACKEND)


def test_a_queue_timeout_is_raised_by_admitted_and_the_runner_loses_nothing(tiny) -> None:
    # the shortage clock starts once the pool refuses the waiter (the hog decoding):
    # 1 ms is far less than the hog's 12 decode steps on any machine
    engine = _engine(tiny, queue_timeout_s=0.001)

    async def main() -> tuple[list, list]:
        hog = engine.submit(SeqRequest("hog", list(range(3, 103)), GREEDY, 12))  # 25 -> 28 blocks
        waiter = engine.submit(SeqRequest("waiter", list(range(5, 25)), GREEDY, 4))  # 5 blocks
        engine.start()  # both queued before the first step
        await hog.admitted()
        with pytest.raises(Overloaded) as refused:
            await waiter.admitted()
        assert refused.value.retry_after_s is not None and refused.value.retry_after_s >= 1
        outs = [o async for o in hog]
        again = engine.submit(SeqRequest("hog-again", list(range(3, 103)), GREEDY, 12))
        await again.admitted()
        return outs, [o async for o in again]

    try:
        outs, again = asyncio.run(main())
    finally:
        engine.shutdown(1.0)
    assert len(outs) == 12 and outs[-1].finish == "length"
    assert [o.token_id for o in again] == [o.token_id for o in outs]  # nothing lost or repeated


def test_a_duplicate_request_id_is_refused_at_admission(tiny) -> None:
    engine = _engine(tiny, num_blocks=64, queue_timeout_s=30.0)
    engine.start()

    async def main() -> None:
        first = engine.submit(SeqRequest("same", list(range(3, 13)), GREEDY, 50))
        await first.admitted()
        second = engine.submit(SeqRequest("same", list(range(3, 13)), GREEDY, 5))
        with pytest.raises(InvalidRequest):
            await second.admitted()
        first.abort()
        assert [o async for o in first][-1].finish in ("abort", "length")

    try:
        asyncio.run(main())
    finally:
        engine.shutdown(1.0)
