"""engine/config.py: the engine's config decided once (rules 1-4), and the engine refusing
one that was not. Stubs stand in for the model and the backend: the rules read only a
cache spec, a weight count and `Backend.pipelines_steps()`."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from frink_mlx.engine.config import EngineConfig, resolve_engine_config
from frink_mlx.engine.engine import Engine
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.speculative import SpecConfig

BASE = EngineConfig(block_size=4, num_blocks=100, max_batch=8, prefill_chunk_tokens=16,
                    batching=True, context_ceiling=64, max_queue=8, queue_timeout_s=5.0,
                    spec=SpecConfig(draft_rows=2))


class _Backend:
    """What resolve_engine_config asks of a backend."""

    def __init__(self, pipelines: bool) -> None:
        self._pipelines = pipelines

    def pipelines_steps(self) -> bool:
        return self._pipelines


class _Model:
    """A model whose make_cache() says which layer kinds it has; `nbytes` of weights."""

    def __init__(self, recurrent: bool = False, nbytes: int = 400) -> None:
        self.recurrent, self.nbytes = recurrent, nbytes

    def make_cache(self) -> list[Any]:
        return [ArraysCache(2) if self.recurrent else KVCache()]

    def parameters(self) -> dict[str, mx.array]:
        return {"w": mx.zeros((self.nbytes // 4,), dtype=mx.float32)}


def _loaded(recurrent: bool = False, nbytes: int = 400) -> types.SimpleNamespace:
    spec = types.SimpleNamespace(has_state=recurrent, family="stub", state_bytes_per_row=640,
                                 kv_bytes_per_token=lambda dtype: 16)
    return types.SimpleNamespace(model=_Model(recurrent, nbytes), cache_spec=spec)


@pytest.mark.parametrize(("setting", "backend", "expected"),
                         [(None, True, True), (None, False, False), (False, True, False),
                          (True, False, True)])
def test_pipelining_is_the_setting_else_the_backends(setting: bool | None, backend: bool,
                                                     expected: bool) -> None:
    config = dataclasses.replace(BASE, pipeline=setting)
    resolved = resolve_engine_config(config, _loaded(), _Backend(backend))
    assert resolved.pipeline is expected and resolved.resolved


def test_recurrent_layers_get_state_slots_and_snapshots_and_keep_speculating() -> None:
    """Rule 2: 8 slots, 32 snapshots; the interval is the largest of the state's bytes over
    a block's K/V (640 / (16 x 4) = 10), the pool over the snapshots (100 / 32 -> 4) and a
    prefill chunk's blocks (16 / 4 = 4)."""
    resolved = resolve_engine_config(BASE, _loaded(recurrent=True), _Backend(True))
    assert resolved.spec is not None and resolved.num_state_slots == BASE.max_batch
    assert resolved.num_snapshots == 32 and resolved.snapshot_interval_blocks == 10
    off = resolve_engine_config(dataclasses.replace(BASE, num_snapshots=0),
                                _loaded(recurrent=True), _Backend(True))
    assert off.num_snapshots == 0


def test_a_draft_model_with_recurrent_layers_is_not_used() -> None:
    resolved = resolve_engine_config(BASE, _loaded(recurrent=True), _Backend(False),
                                     draft=_loaded(recurrent=True, nbytes=100))
    assert resolved.spec is not None and resolved.spec.draft_num_blocks == 0


def test_a_distributed_group_never_pipelines_nor_speculates() -> None:
    config = dataclasses.replace(BASE, pipeline=True)
    resolved = resolve_engine_config(config, _loaded(), _Backend(True),
                                     distributed=True)
    assert resolved.pipeline is False and resolved.spec is None


def test_a_distributed_group_gives_recurrent_layers_slots_and_snapshots() -> None:
    """Rule 3: rank 0's part keeps its state slots and snapshots (rule 2's numbers); the
    group still never speculates nor pipelines."""
    resolved = resolve_engine_config(BASE, _loaded(recurrent=True), _Backend(True),
                                     distributed=True)
    assert resolved.num_state_slots == BASE.max_batch and resolved.num_snapshots == 32
    assert resolved.snapshot_interval_blocks == 10
    assert resolved.spec is None and resolved.pipeline is False


def test_a_draft_model_gets_its_pool_and_step_cost() -> None:
    """Rule 4: 2 rows x ceil(64 / 4) = 32 blocks; cost 100 / 400 bytes of weights."""
    resolved = resolve_engine_config(BASE, _loaded(nbytes=400), _Backend(False),
                                     draft=_loaded(nbytes=100))
    assert resolved.spec is not None
    assert resolved.spec.draft_num_blocks == 32 and resolved.spec.draft_step_cost == 0.25
    without = resolve_engine_config(BASE, _loaded(), _Backend(False))
    assert without.spec is not None and without.spec.draft_num_blocks == 0


def test_the_engine_refuses_a_config_not_resolved() -> None:
    with pytest.raises(ValueError, match="not resolved"):
        Engine(_loaded(), BASE, DecodeGate(), _Backend(False))
    resolved = resolve_engine_config(BASE, _loaded(), _Backend(True))
    with pytest.raises(ValueError, match="not resolved"):  # resolved for a lone engine
        Engine(_loaded(), resolved, DecodeGate(), _Backend(True),
               channel=object())
