"""The hybrid prefix cache (engine/kv/snapshots.py): turn-2 TTFT of a chat on a qwen3_5 shape.

A random qwen3_5 (GatedDeltaNet + attention; hidden 512, 12 layers) built from mlx-lm's
own classes, driven through the real `Engine`: turn 1 is a ~1,000-token prompt and 32
greedy tokens, turn 2 is turn 1's prompt + its reply + a 40-token message. Each turn's
TTFT (submit to first token) is timed with the state snapshots on and off
(`num_snapshots=0`: the prefix cache off, as before issue 29), and turn 2's greedy tokens
must be the same either way. One run; figures are printed, not asserted.

    python benchmarks/hybrid_prefix_bench.py [--prompt 1000]
"""

from __future__ import annotations

import argparse
import random
import time
import types

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3_5

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.settings import Settings

GREEDY = SamplingParams(temperature=0)
TEXT = dict(model_type="qwen3_5_text", hidden_size=512, intermediate_size=1024,
            num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
            vocab_size=4096, max_position_embeddings=4096, rms_norm_eps=1e-6,
            tie_word_embeddings=True, linear_num_value_heads=8, linear_num_key_heads=4,
            linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4,
            full_attention_interval=4)


def build() -> types.SimpleNamespace:
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(dict(model_type="qwen3_5", text_config=TEXT)))
    mx.random.seed(0)
    model.update(tree_unflatten([(k, mx.ones(v.shape) if k.endswith("norm.weight") else
                                  mx.random.normal(v.shape) * 0.05)
                                 for k, v in tree_flatten(model.parameters())]))
    mx.eval(model.parameters())
    return types.SimpleNamespace(model=model, dtype=mx.float32, context_length=4096)


def turn(engine: Engine, request_id: str, prompt: list[int], n: int) -> tuple[float, list[int], int]:
    started = time.perf_counter()
    ttft, ids, cached = 0.0, [], 0
    for out in engine.submit(SeqRequest(request_id, prompt, GREEDY, n)):
        if not ids:
            ttft, cached = time.perf_counter() - started, out.num_cached_tokens or 0
        ids.append(out.token_id)
    return ttft, ids, cached


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt", type=int, default=1000)
    args = parser.parse_args()
    loaded = build()
    rng = random.Random(1)
    first = [rng.randrange(1, 4096) for _ in range(args.prompt)]
    message = [rng.randrange(1, 4096) for _ in range(40)]
    backend = select_backend(Settings().backend_config())
    seen: list[list[int]] = []
    for label, snapshots in (("snapshots on", None), ("snapshots off", 0)):
        engine = Engine(loaded, EngineConfig(
            block_size=4, num_blocks=2048, max_batch=4, prefill_chunk_tokens=256,
            idle_prefill_tokens=768, batching=True, context_ceiling=4096, max_queue=8,
            queue_timeout_s=600.0, num_snapshots=snapshots), DecodeGate(), backend)
        engine.start()
        try:
            t1, reply, _ = turn(engine, "t1", first, 32)
            second = first + reply + message
            t2, ids, cached = turn(engine, "t2", second, 16)
        finally:
            engine.shutdown(1.0)
        seen.append(ids)
        print(f"{label:14s} turn 1 TTFT {t1 * 1000:7.0f} ms ({len(first)} tokens)   "
              f"turn 2 TTFT {t2 * 1000:7.0f} ms ({len(second)} tokens, {cached} cached)   "
              f"ratio {t2 / t1:.2f}   snapshot interval "
              f"{engine.kv.snapshots.interval_tokens if engine.kv.snapshots else '-'} tokens")
    print("turn 2 greedy ids equal with and without snapshots:", seen[0] == seen[1])


if __name__ == "__main__":
    main()
