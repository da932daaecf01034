"""What one decode step's attention must cost at a long context on this machine (issue 31).

    .venv/bin/python benchmarks/attention_floor.py [--contexts 512,8000,32000] [--layers 4]
                                                   [--heads 4] [--kv-heads 1] [--head-dim 64]

Why: issue 31 asks frink-mlx's own decode rate at 32k to stay >= 0.6x its rate
at 512 on long_context_bench.py's tiny random model. A decode step must read
every layer's K and V of the whole context once; on a model that small the
rest of the step is a few milliseconds, so that read alone can set the ratio.
This prints, per context, with the model's shape (defaults: long_context_bench
TINY_32K, float32 K/V):
1. the bytes of K and V one step reads (layers x 2 x context x kv heads x dim x 4);
2. the time to stream that many bytes once, the best of numpy's sum and
   MLX's sum over an array of that size (the memory floor: no attention can
   read its keys faster than a plain sum does);
3. MLX's own fused `mx.fast.scaled_dot_product_attention` over a contiguous
   cache of that length for every layer (what mlx-lm's decode calls);
4. given a measured step time at the shortest context (--step-ms-short,
   e.g. 1000 / long_context_bench's 512-token decode tok/s), the best ratio
   the floor allows: step_short / (step_short + floor(long) - floor(short)).
One run, no server; the figures of a run go to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np


def best_ms(fn: object, repeats: int) -> float:
    for _ in range(3):
        fn()  # type: ignore[operator]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def floor_ms(num_bytes: int, repeats: int) -> float:
    """Step 2: the faster of two plain sums over `num_bytes` of float32."""
    host = np.random.rand(num_bytes // 4).astype(np.float32)
    dev = mx.array(host)
    mx.eval(dev)
    return min(best_ms(lambda: host.sum(), repeats), best_ms(lambda: mx.eval(dev.sum()), repeats))


def sdpa_ms(args: argparse.Namespace, context: int) -> float:
    """Step 3: mlx's fused attention of one query over `context` keys, every layer."""
    q = mx.random.normal((1, args.heads, 1, args.head_dim))
    kv = [(mx.random.normal((1, args.kv_heads, context, args.head_dim)),
           mx.random.normal((1, args.kv_heads, context, args.head_dim))) for _ in range(args.layers)]
    mx.eval(q, kv)
    scale = args.head_dim ** -0.5
    return best_ms(lambda: mx.eval([mx.fast.scaled_dot_product_attention(q, k, v, scale=scale)
                                    for k, v in kv]), args.repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", default="512,8000,32000")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--step-ms-short", type=float, default=None,
                    help="measured decode step at the shortest context (ms), for step 4")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    floors = {}
    print(f"shape: {args.layers} layers, {args.heads} heads, {args.kv_heads} kv heads of "
          f"{args.head_dim}, float32 K/V; {mx.default_device()}")
    for context in contexts:
        num_bytes = args.layers * 2 * context * args.kv_heads * args.head_dim * 4
        floors[context] = floor_ms(num_bytes, args.repeats)
        print(f"  context {context:6d}: K+V read {num_bytes / 2**20:7.1f} MiB, memory floor "
              f"{floors[context]:7.2f} ms ({num_bytes / floors[context] / 1e6:5.1f} GB/s), "
              f"mx.fast sdpa {sdpa_ms(args, context):7.2f} ms", flush=True)
    if args.step_ms_short is not None:
        short = contexts[0]
        for context in contexts[1:]:
            best = args.step_ms_short / (args.step_ms_short + floors[context] - floors[short])
            print(f"  best decode ratio {context} / {short} the floor allows, from a "
                  f"{args.step_ms_short:.2f} ms step at {short}: {best:.2f}")


if __name__ == "__main__":
    main()
