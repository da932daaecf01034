"""Greedy parity on the real default model (SmolLM2-135M, dequantized fp32 on CPU).

Ragged prompts joining a running batch, chunked prefill and a prefix hit:
every row equals `mlx_lm.generate_step` run alone on the same weights.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

pytestmark = pytest.mark.slow
NUM_TOKENS = 12


def test_smollm2_batched_greedy_equals_generate(smollm2_dir, tmp_path):
    loaded = load_model(ModelSpec(name="smollm2", source=str(smollm2_dir)),
                        Settings(cache_dir=str(tmp_path)).load_config(), BACKEND)
    tok = loaded.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):",
             "Once upon a time, in a land far away, there lived a"]
    prompts = [tok.encode(t) for t in texts]
    prompts.append(prompts[2] + tok.encode(" dragon who"))  # shares blocks with prompt 2
    expected = [[int(t) for t, _ in generate_step(mx.array(p), loaded.model, max_tokens=NUM_TOKENS)]
                for p in prompts]
    config = EngineConfig(block_size=4, num_blocks=128, max_batch=4, prefill_chunk_tokens=5,
                          batching=True, context_ceiling=512, max_queue=8, queue_timeout_s=120.0)
    engine = Engine(loaded, resolve_engine_config(config, loaded, BACKEND), DecodeGate(), BACKEND)
    engine.start()
    try:
        greedy = SamplingParams(temperature=0)
        first = [engine.submit(SeqRequest(f"p{i}", p, greedy, NUM_TOKENS)) for i, p in enumerate(prompts[:3])]
        it = iter(first[0])
        head = [next(it).token_id for _ in range(3)]  # the batch is running; now one more joins
        late = engine.submit(SeqRequest("late", prompts[3], greedy, NUM_TOKENS))
        got = [head + [o.token_id for o in it]]
        got += [[o.token_id for o in s] for s in first[1:]]
        late_outs = list(late)
        got.append([o.token_id for o in late_outs])
    finally:
        engine.shutdown(5.0)
    assert got == expected
    assert late_outs[0].num_cached_tokens and late_outs[0].num_cached_tokens > 0
