"""Speculative decoding on the real default model (SmolLM2-135M, fp32 on CPU).

An editing prompt (code, then "the same code again") makes prompt-lookup drafts fire;
beside it in the batch, a free-form prompt and a prompt sharing blocks with the first
(a prefix hit), in small prefill chunks. Every row must equal `mlx_lm.generate_step`
run alone, token for token, and drafts must have been accepted.
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
from frink_mlx.engine.speculative import SpecConfig
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())

pytestmark = pytest.mark.slow
NUM_TOKENS = 40
CODE = '''def moving_average(values, window):
    """Average of each run of `window` values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''


def test_smollm2_speculative_greedy_equals_generate(smollm2_dir, tmp_path):
    loaded = load_model(ModelSpec(name="smollm2", source=str(smollm2_dir)),
                        Settings(cache_dir=str(tmp_path)).load_config(), BACKEND)
    tok = loaded.tokenizer
    texts = [CODE + "\n# The same function, unchanged:\n\ndef moving_average(",
             "Once upon a time, in a land far away, there lived a"]
    prompts = [tok.encode(t) for t in texts]
    prompts.append(prompts[0][:-3] + tok.encode(" copy:\n\ndef"))  # shares blocks with 0
    expected = [[int(t) for t, _ in generate_step(mx.array(p), loaded.model, max_tokens=NUM_TOKENS)]
                for p in prompts]
    config = EngineConfig(block_size=4, num_blocks=512, max_batch=4, prefill_chunk_tokens=24,
                          batching=True, context_ceiling=1024, max_queue=8, queue_timeout_s=120.0,
                          # three rows speculate together (engine/speculative/ rule 5)
                          spec=SpecConfig(max_rows=4))
    engine = Engine(loaded, resolve_engine_config(config, loaded, BACKEND), DecodeGate(), BACKEND)
    engine.start()
    try:
        greedy = SamplingParams(temperature=0)
        streams = [engine.submit(SeqRequest(f"p{i}", p, greedy, NUM_TOKENS))
                   for i, p in enumerate(prompts)]
        outs = [list(s) for s in streams]
        stats = engine.stats()
    finally:
        engine.shutdown(5.0)
    assert [[o.token_id for o in row] for row in outs] == expected
    assert stats.draft_accepted_tokens_total >= 10
    assert sum(o.num_draft_accepted or 0 for o in outs[0]) > 0
