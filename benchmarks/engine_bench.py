"""Engine throughput against the bare model and mlx-lm, in one process.

Prints:
1. raw batched decode tok/s of the bare mlx-lm model at batch 1/8/16 (a
   plain KVCache loop, pipelined like generate_step): the kernel ceiling;
2. the engine's aggregate output tok/s with 1/8/16 concurrent sequences
   (decode only: from the first token of every row to the last);
3. single-stream decode tok/s: `mlx_lm.stream_generate` vs the engine;
4. engine decode tok/s with a small and a large KV pool (rule 1 of
   kv/paged.py: it must not depend on the pool size).

Run with OpenBLAS preloaded on Linux:
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 .venv/bin/python benchmarks/engine_bench.py
Options: --model NAME (registry entry, default the registry default),
--tokens N (per row, default 64), --batches 1,8,16 (empty: skip), --repeat N
(best of N), --pools 256,2048 (empty: skip).
"""

from __future__ import annotations

import argparse
import random
import threading
import time

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.models.cache import make_prompt_cache

from frink_mlx.backend import Backend, select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.loader import load_model
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

GREEDY = SamplingParams(temperature=0)


def prompts(num: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, vocab - 1) for _ in range(length)] for _ in range(num)]


def raw_decode_tps(model, batch: int, num_tokens: int, prompt_len: int, vocab: int) -> float:
    cache = make_prompt_cache(model)
    x = mx.array(prompts(batch, prompt_len, vocab))
    y = mx.argmax(model(x, cache=cache)[:, -1], -1)
    mx.eval(y)
    start = time.perf_counter()
    for _ in range(num_tokens):
        nxt = mx.argmax(model(y[:, None], cache=cache)[:, -1], -1)
        mx.async_eval(nxt)
        y.tolist()
        y = nxt
    y.tolist()
    return batch * num_tokens / (time.perf_counter() - start)


def engine_decode_tps(engine: Engine, batch: int, num_tokens: int, prompt_len: int, vocab: int) -> float:
    streams = [engine.submit(SeqRequest(f"b{batch}-{i}-{time.monotonic_ns()}", p, GREEDY, num_tokens,
                                        stop_token_ids=frozenset()))
               for i, p in enumerate(prompts(batch, prompt_len, vocab))]
    firsts, lasts, counts = [0.0] * batch, [0.0] * batch, [0] * batch

    def consume(i: int) -> None:
        for out in streams[i]:
            now = time.perf_counter()
            if counts[i] == 0:
                firsts[i] = now
            counts[i] += 1
            lasts[i] = now

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (sum(counts) - batch) / (max(lasts) - max(firsts))


def stream_generate_tps(model, tokenizer, prompt: list[int], num_tokens: int) -> float:
    last = None
    for last in stream_generate(model, tokenizer, prompt, max_tokens=num_tokens):
        pass
    return last.generation_tps


def make_engine(loaded, num_blocks: int, max_batch: int, backend: Backend) -> Engine:
    cfg = EngineConfig(block_size=16, num_blocks=num_blocks, max_batch=max_batch,
                       prefill_chunk_tokens=256, batching=True, context_ceiling=2048,
                       max_queue=64, queue_timeout_s=300.0, generation=1)
    engine = Engine(loaded, resolve_engine_config(cfg, loaded, backend), DecodeGate(), backend)
    engine.start()
    return engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--repeat", type=int, default=3, help="best of N (the CPU may be shared)")
    ap.add_argument("--pools", default="256,2048", help="pool sizes (blocks) for the size check")
    args = ap.parse_args()
    settings = Settings.load()
    spec = load_registry(settings).resolve(args.model)
    backend = select_backend(settings.backend_config())
    loaded = load_model(spec, settings.load_config(), backend)
    model, vocab = loaded.model, loaded.model.args.vocab_size
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    print(f"model {spec.name} dtype {loaded.dtype} tokens/row {args.tokens} prompt {args.prompt_len}")

    engine = make_engine(loaded, num_blocks=256, max_batch=max(batches, default=1), backend=backend)
    best = lambda f: max(f() for _ in range(args.repeat))  # noqa: E731 - best of N on a shared CPU
    for batch in batches:
        raw = best(lambda: raw_decode_tps(model, batch, args.tokens, args.prompt_len, vocab))
        eng = best(lambda: engine_decode_tps(engine, batch, args.tokens, args.prompt_len, vocab))
        print(f"batch {batch:3d}: raw {raw:7.1f} tok/s   engine {eng:7.1f} tok/s   ratio {eng / raw:.2f}",
              flush=True)

    prompt = prompts(1, args.prompt_len, vocab)[0]
    ref = eng = 0.0
    for _ in range(args.repeat):  # interleaved, so both see the same machine load
        ref = max(ref, stream_generate_tps(model, loaded.tokenizer, prompt, args.tokens))
        eng = max(eng, engine_decode_tps(engine, 1, args.tokens, args.prompt_len, vocab))
    print(f"single stream: mlx_lm.stream_generate {ref:.1f} tok/s   engine {eng:.1f} tok/s   "
          f"ratio {eng / ref:.2f}", flush=True)
    engine.shutdown(5.0)

    for num_blocks in [int(b) for b in args.pools.split(",") if b.strip()]:
        engine = make_engine(loaded, num_blocks=num_blocks, max_batch=8, backend=backend)
        eng = best(lambda: engine_decode_tps(engine, 8, args.tokens, args.prompt_len, vocab))
        print(f"pool {num_blocks:5d} blocks ({engine.store.nbytes / 2**20:.0f} MiB): "
              f"engine batch 8 {eng:.1f} tok/s", flush=True)
        engine.shutdown(5.0)


if __name__ == "__main__":
    main()
