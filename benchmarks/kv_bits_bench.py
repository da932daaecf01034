"""KV blocks in 8 or 4 bits (`kv_bits`, engine/kv/quantized.py) against float KV, in one process.

    .venv/bin/python benchmarks/kv_bits_bench.py          # the default model (SmolLM2-135M)

What one run prints (issue 31's targets in brackets):
1. The context ceiling at the same memory budget: `plan_kv` over the loaded
   model with a device budget of its weights plus `--pool-mib`, headroom 0,
   float / 8 / 4 bits; the pool's tokens (num_blocks * block_size, before the
   trained-context cap) and the ratio to float [>= 1.9x at 8, >= 3.5x at 4],
   and the bytes the pools really hold when built at that size.
2. Greedy agreement with float KV: `--prompts` chat prompts (distinct questions,
   the model's own template), `--tokens` tokens each, end-of-text ignored, all
   rows batched in one engine per width; per row the fraction of tokens before
   the first divergence from the float row, averaged [>= 95% at 8 bits], and
   the per-token agreement.
3. Decode tok/s at `--clients` concurrent rows of a `--context`-token prompt
   (and `--long-context`), `--decode-tokens` out: all rows' tokens after their
   first, over the last row's first token to the last token, per width, alternated
   float / 8 / 4 `--repeat` times (best of each; the machine may be shared)
   [8 bits >= 0.9x float]. The 1-minute load average is printed beside.
4. Which read serves quantized blocks best on this backend (kv/quantized.py
   rule 2): one layer's decode read at the default model's shape, float vs
   8-bit dequantized gathers vs 8-bit quantized products.
5. The reference for step 2: mlx-lm's own `generate_step` on the same prompts,
   float vs `kv_bits=8, kv_group_size=64, quantized_kv_start=0` (its default
   start, 5000, never quantizes rows this short), one row at a time; the same
   two figures. If mlx-lm's own agreement is as low as ours, the quantization
   scheme, not the engine, is the bound.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
import types

import mlx.core as mx

from frink_mlx.backend import MemoryBudget, select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.budget import plan_kv, weights_nbytes
from frink_mlx.models.loader import load_model
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

GREEDY = SamplingParams(temperature=0)
WIDTHS = (None, 8, 4)
QUESTIONS = [
    "What is the capital of France, and why is it famous?",
    "Write a short poem about the sea at night.",
    "Explain how a binary search works, step by step.",
    "Give me three tips for learning a new language.",
    "What causes the seasons on Earth?",
    "Write a Python function that reverses a string.",
    "Describe the water cycle to a ten-year-old.",
    "What are the main differences between cats and dogs as pets?",
    "Summarise the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
    "Write a haiku about autumn leaves.",
    "What is the difference between a list and a tuple in Python?",
    "Explain photosynthesis in simple terms.",
    "Suggest a healthy breakfast and say why it is healthy.",
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "How does a refrigerator keep food cold?",
    "List five famous inventors and what they invented.",
    "What is recursion? Give an example.",
    "Describe a walk through a busy city market.",
]


def load_avg() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def ceilings(loaded, pool_mib: int, block_size: int) -> None:
    """Step 1."""
    budget = MemoryBudget(nbytes=weights_nbytes(loaded.model) + pool_mib * 2 ** 20,
                          source="override")
    base = Settings(memory_headroom_fraction=0.0, block_size=block_size,
                    max_kv_pool_bytes=1 << 40).budget_config()
    subject = types.SimpleNamespace(model=loaded.model, dtype=loaded.dtype, spec=None,
                                    cache_spec=loaded.cache_spec, context_length=1 << 30)
    print(f"1. context ceiling, device budget = weights + {pool_mib} MiB, headroom 0, "
          f"block {block_size}; trained context {loaded.context_length}")
    float_tokens = 0
    for bits in WIDTHS:
        config = Settings(memory_headroom_fraction=0.0, block_size=block_size,
                          max_kv_pool_bytes=1 << 40, kv_bits=bits).budget_config()
        plan = plan_kv(subject, config if bits else base, budget)
        tokens = plan.num_blocks * plan.block_size
        float_tokens = float_tokens or tokens
        engine = make_engine(loaded, plan.num_blocks, 1, bits, block_size, start=False)
        held = engine.store.nbytes
        engine.shutdown(1.0)
        print(f"   kv_bits={bits or 'float':>5}: {plan.bytes_per_token:6d} B/token, "
              f"{plan.num_blocks:7d} blocks = {tokens:7d} tokens "
              f"({tokens / float_tokens:.2f}x float), ceiling "
              f"{min(tokens, loaded.context_length)}; pools built: {held / 2 ** 20:.1f} MiB "
              f"(priced {plan.pool_bytes / 2 ** 20:.1f} MiB)", flush=True)


def make_engine(loaded, num_blocks: int, max_batch: int, bits: int | None, block_size: int,
                start: bool = True) -> Engine:
    cfg = EngineConfig(block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
                       prefill_chunk_tokens=256, batching=True, context_ceiling=8192,
                       max_queue=256, queue_timeout_s=600.0, generation=1, kv_bits=bits,
                       spec=None)
    engine = Engine(loaded, resolve_engine_config(cfg, loaded, BACKEND), DecodeGate(), BACKEND)
    if start:
        engine.start()
    return engine


def run_rows(engine: Engine, prompts: list[list[int]], num_tokens: int, tag: str
             ) -> tuple[list[list[int]], float]:
    """Every prompt submitted at once; (each row's tokens, decode tok/s of step 3)."""
    streams = [engine.submit(SeqRequest(f"{tag}-{i}-{time.monotonic_ns()}", p, GREEDY,
                                        num_tokens, stop_token_ids=frozenset()))
               for i, p in enumerate(prompts)]
    rows: list[list[int]] = [[] for _ in prompts]
    firsts, lasts = [0.0] * len(prompts), [0.0] * len(prompts)

    def consume(i: int) -> None:
        for out in streams[i]:
            now = time.perf_counter()
            if out.token_id is None:
                continue
            if not rows[i]:
                firsts[i] = now
            rows[i].append(out.token_id)
            lasts[i] = now

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(r) for r in rows)
    return rows, (total - len(rows)) / max(1e-9, max(lasts) - max(firsts))


def chat_prompts(loaded, num_prompts: int) -> list[list[int]]:
    tok = loaded.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
            for q in (QUESTIONS * 2)[:num_prompts]]


def agreement(loaded, num_prompts: int, num_tokens: int, block_size: int,
              widths: tuple[int | None, ...]) -> None:
    """Step 2."""
    prompts = chat_prompts(loaded, num_prompts)
    print(f"2. greedy agreement with float KV: {num_prompts} prompts x {num_tokens} tokens "
          f"(load {load_avg()})")
    outs = {}
    for bits in widths:
        engine = make_engine(loaded, 4096, num_prompts, bits, block_size)
        outs[bits], _ = run_rows(engine, prompts, num_tokens, f"agree{bits}")
        engine.shutdown(5.0)
    for bits in widths[1:]:
        print(f"   kv_bits={bits}: {agreement_line(outs[None], outs[bits])}", flush=True)


def agreement_line(reference: list[list[int]], rows: list[list[int]]) -> str:
    """Step 2's two figures: mean fraction before the first divergence, per-token agreement."""
    before, same = [], 0
    for ref, got in zip(reference, rows):
        first = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), len(ref))
        before.append(first / len(ref))
        same += sum(a == b for a, b in zip(ref, got))
    full = sum(1 for b in before if b == 1.0)
    return (f"mean fraction before the first divergence {sum(before) / len(before):.3f} "
            f"({full}/{len(before)} rows identical), per-token agreement "
            f"{same / sum(len(r) for r in reference):.3f}")


def mlx_lm_agreement(loaded, num_prompts: int, num_tokens: int) -> None:
    """Step 5: mlx-lm's own generation, float vs its quantized KV cache from token 0."""
    from mlx_lm.generate import generate_step

    def rows(**kv: int) -> list[list[int]]:
        return [[int(t) for t, _ in generate_step(mx.array(p), loaded.model,
                                                   max_tokens=num_tokens, **kv)]
                for p in chat_prompts(loaded, num_prompts)]

    print(f"5. mlx-lm generate_step's own agreement: {num_prompts} prompts x {num_tokens} "
          f"tokens, one row at a time (load {load_avg()})")
    reference = rows()
    for bits in (8, 4):
        quant = rows(kv_bits=bits, kv_group_size=64, quantized_kv_start=0)
        print(f"   kv_bits={bits}, group 64, quantized_kv_start=0: "
              f"{agreement_line(reference, quant)}", flush=True)


def decode(loaded, clients: int, contexts: list[int], num_tokens: int, repeat: int,
           block_size: int, widths: tuple[int | None, ...]) -> None:
    """Step 3."""
    vocab = loaded.model.args.vocab_size
    engines = {bits: make_engine(loaded, 4096, clients, bits, block_size) for bits in widths}
    for context in contexts:
        rng = random.Random(context)
        best = dict.fromkeys(widths, 0.0)
        for r in range(repeat):
            for bits in widths:
                prompts = [[rng.randrange(100, vocab - 1) for _ in range(context)]
                           for _ in range(clients)]
                _, rate = run_rows(engines[bits], prompts, num_tokens, f"dec{bits}-{r}")
                best[bits] = max(best[bits], rate)
        print(f"3. decode, {clients} clients x {context}-token prompts, {num_tokens} out, "
              f"best of {repeat} (load {load_avg()}): "
              + ", ".join(f"{b or 'float'} {best[b]:.1f} tok/s" for b in widths) + "; "
              + ", ".join(f"{b} bits {best[b] / best[None]:.2f}x float" for b in widths[1:]),
              flush=True)
    for engine in engines.values():
        engine.shutdown(5.0)


def read_paths(repeat: int) -> None:
    """Step 4: one layer's decode read of the default model's shape (3 KV heads of 64,
    9 query heads), 8 rows of T tokens gathered out of a pool: float (the gather, then
    the CPU attention), 8 bits dequantized (gather the parts, `mx.dequantize`, float
    attention), 8 bits quantized (gather the parts, the quantized-product attention);
    best of `repeat` rounds, interleaved."""
    from frink_mlx.backend.cpu.kernels import attention

    heads, group, dim, slots = 3, 3, 64, 8 * 2048 + 1
    pools = [mx.random.normal((heads, slots, dim), key=mx.random.key(i)) for i in range(2)]
    quant = [mx.quantize(p, group_size=64, bits=8) for p in pools]
    mx.eval(pools, quant)
    print(f"4. one layer's decode read, 8 rows, best of {repeat} (load {load_avg()}):")
    for rows, width in ((8, 512), (8, 2048)):
        q = mx.random.normal((rows, heads * group, 1, dim), key=mx.random.key(9))
        slot = mx.arange(rows * width, dtype=mx.int32).reshape(rows, width)
        index = mx.arange(heads, dtype=mx.int32)[:, None, None] * slots + slot[None]

        def take(pool: mx.array) -> mx.array:
            flat = pool.reshape(heads * slots, pool.shape[-1])
            return mx.take(flat, index, axis=0).transpose(1, 0, 2, 3)

        paths = {
            "float": lambda: attention(q, take(pools[0]), take(pools[1]), 0.125, None),
            "8-bit dequantized": lambda: attention(
                q, *(mx.dequantize(*(take(a) for a in part), group_size=64, bits=8)
                     for part in quant), 0.125, None),
            "8-bit quantized": lambda: attention(
                q, tuple(take(a) for a in quant[0]), tuple(take(a) for a in quant[1]),
                0.125, None, (64, 8)),
        }
        best = dict.fromkeys(paths, float("inf"))
        for _ in range(repeat):
            for name, path in paths.items():
                start = time.perf_counter()
                mx.eval(path())
                best[name] = min(best[name], (time.perf_counter() - start) * 1e3)
        print(f"   T={width}: " + ", ".join(f"{n} {ms:.2f} ms" for n, ms in best.items()),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--pool-mib", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--long-context", type=int, default=2048, help="0: skip")
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip", default="", help="steps to skip, e.g. 2,3")
    ap.add_argument("--widths", default="float,8,4", help="KV widths of steps 2-3")
    args = ap.parse_args()
    settings = Settings.load()
    spec = load_registry(settings).resolve(args.model)
    loaded = load_model(spec, settings.load_config(), BACKEND)
    print(f"model {spec.name} ({loaded.model.args.model_type}), KV dtype {loaded.dtype}, "
          f"backend {BACKEND.name}, mlx {mx.__version__}, load {load_avg()}", flush=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    widths = tuple(None if w == "float" else int(w) for w in args.widths.split(","))
    if widths[0] is not None:
        raise SystemExit("--widths starts with float (the reference)")
    if "1" not in skip:
        ceilings(loaded, args.pool_mib, args.block_size)
    if "2" not in skip:
        agreement(loaded, args.prompts, args.tokens, args.block_size, widths)
    if "3" not in skip:
        contexts = [args.context] + ([args.long_context] if args.long_context else [])
        decode(loaded, args.clients, contexts, args.decode_tokens, args.repeat, args.block_size,
               widths)
    if "4" not in skip:
        read_paths(30)
    if "5" not in skip:
        mlx_lm_agreement(loaded, args.prompts, args.tokens)


BACKEND = select_backend(Settings.load().backend_config())

if __name__ == "__main__":
    main()
