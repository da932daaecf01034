"""Engine.submit refuses out-of-range sampling knobs: they would fail a whole batched step."""

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
from frink_mlx.errors import InvalidRequest
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    tiny = types.SimpleNamespace(model=model, dtype=mx.float32, context_length=2048)
    cfg = EngineConfig(block_size=4, num_blocks=64, max_batch=4, prefill_chunk_tokens=8,
                       batching=True, context_ceiling=128, max_queue=8, queue_timeout_s=30.0,
                       generation=1)
    eng = Engine(tiny, resolve_engine_config(cfg, tiny, BACKEND), DecodeGate(), BACKEND)
    eng.start()
    yield eng
    eng.shutdown(1.0)


@pytest.mark.parametrize("params,param", [
    (SamplingParams(min_p=2.0), "min_p"),
    (SamplingParams(repetition_penalty=1e308), "repetition_penalty"),
    (SamplingParams(top_p=float("nan")), "top_p"),
])
def test_submit_refuses_out_of_range_sampling(engine, params, param):
    with pytest.raises(InvalidRequest) as err:
        engine.submit(SeqRequest("bad", [5, 6, 7], params, 4))
    assert err.value.param == param
    # the engine goes on serving
    outs = list(engine.submit(SeqRequest("good", [5, 6, 7], SamplingParams(temperature=0), 4)))
    assert [o.finish for o in outs][-1] == "length" and len(outs) == 4
