"""What the engine tests share (test_engine.py, test_spec.py, test_spec_draft.py,
test_turns.py): a tiny model loaded as the engine takes it, an engine factory that shuts
down what it made, random prompts, mlx-lm's greedy reference, a stream's tokens per row."""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from frink_mlx.backend import select_backend
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.speculative import SpecConfig
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())


def loaded(path: Path, edit: Callable[[Any], None] | None = None) -> types.SimpleNamespace:
    """The checkpoint at `path` as the engine takes a loaded model; `edit` may change
    its weights first."""
    model, _ = load(str(path))
    if edit is not None:
        edit(model)
        mx.eval(model.parameters())
    return types.SimpleNamespace(model=model, dtype=mx.float32, context_length=2048)


def engine_factory(**defaults: Any) -> Iterator[Callable[..., Engine]]:
    """A fixture body: `make(loaded, draft=None, gate=None, start=True, disk=None,
    **overrides)` makes an engine with these limits, `defaults` and `overrides` on top (and
    the SSD tier `disk`); every engine made is shut down after the test. Engines given one
    `gate` share it, as resident models do."""
    made: list[Engine] = []

    def make(model: Any, draft: Any = None, *, gate: DecodeGate | None = None,
             start: bool = True, disk: Any = None, **overrides: Any) -> Engine:
        cfg = dict(block_size=4, max_batch=8, batching=True, max_queue=64, queue_timeout_s=30.0,
                   generation=1)
        cfg.update(defaults)
        cfg.update(overrides)
        config = resolve_engine_config(EngineConfig(**cfg), model, BACKEND, draft=draft)
        engine = Engine(model, config, gate or DecodeGate(), BACKEND, draft=draft, disk=disk)
        if start:
            engine.start()
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.shutdown(1.0)


def engines(spec: SpecConfig) -> Iterator[Callable[..., Engine]]:
    """`engine_factory` with the speculation tests' limits and speculation `spec`."""
    return engine_factory(num_blocks=256, prefill_chunk_tokens=16, context_ceiling=512,
                          spec=spec, pipeline=False)


def random_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 380) for _ in range(n)]


def greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy continuation of `ids`."""
    return [int(t) for t, _ in generate_step(mx.array(ids), model.model, max_tokens=n)]


def tokens(stream: Any) -> dict[int, list[int]]:
    """The token ids a stream produced, per row index."""
    rows: dict[int, list[int]] = {}
    for out in stream:
        if out.token_id is not None:
            rows.setdefault(out.index, []).append(out.token_id)
    return rows
