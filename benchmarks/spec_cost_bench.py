"""What a verify step costs: the engine's own Runner timed by rows, width and context.

Why: engine/speculative/ rule 3 prices a step of B rows of L positions at contexts
up to T; this measures the real curve on this machine (fp32 SmolLM2 through
the CPU backend's kernels, paged KV), so the cost model's prior and its
context term rest on numbers, not guesses. Each (B, L, T) is one hand-built
decode plan (rows at position T, drafts of L - 1 tokens) run `--reps` times
after a warm-up; the KV pool's contents are arbitrary (only time is measured).
It prints a table and the least-squares fit of
    time = c0 + c1 * B * L + c2 * B * L * T / 1000
with c1 / c0 and c2 / c0, the two ratios the cost model uses.

    flock -x /tmp/frink-bench.lock .venv/bin/python benchmarks/spec_cost_bench.py \\
        --fp32-dir /tmp/spec-fp32/smollm2-fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run(args: argparse.Namespace) -> list[tuple[int, int, int, float]]:
    import mlx.core as mx

    from frink_mlx.backend import select_backend
    from frink_mlx.core.request import SamplingParams
    from frink_mlx.engine.kv.paged import PagedKVStore, model_kv_geometry
    from frink_mlx.engine.plan import DecodeRow, SchedulerOutput
    from frink_mlx.engine.runner import Runner
    from frink_mlx.engine.sampling import RowSampler
    from frink_mlx.models.loader import load_model
    from frink_mlx.registry import ModelSpec
    from frink_mlx.settings import Settings

    settings = Settings()
    backend = select_backend(settings.backend_config())
    loaded = load_model(ModelSpec(name="bench", source=args.fp32_dir, dequantize=False),
                        settings.load_config(), backend)
    layers, heads, head_dim = model_kv_geometry(loaded.model)
    bs = 16
    per_row = -(-(max(args.contexts) + max(args.widths)) // bs)
    store = PagedKVStore(num_layers=layers, num_blocks=per_row * max(args.rows) + 1,
                         block_size=bs, n_kv_heads=heads, head_dim=head_dim, dtype=loaded.dtype)
    runner = Runner(loaded.model, store, backend.prepare_decoder(loaded.model))
    greedy = SamplingParams(temperature=0)
    out = []
    with mx.stream(mx.default_stream(mx.default_device())):
        for rows in args.rows:
            samplers = {i: RowSampler(greedy, i) for i in range(rows)}
            for context in args.contexts:
                for width in args.widths:
                    def plan() -> SchedulerOutput:
                        decode = [DecodeRow(i, context, list(range(i * per_row, (i + 1) * per_row)),
                                            17, [42] * (width - 1)) for i in range(rows)]
                        return SchedulerOutput(decode=decode)
                    runner.run(plan(), samplers).read()  # warm-up
                    times = []
                    for _ in range(args.reps):
                        started = time.perf_counter()
                        runner.run(plan(), samplers).read()
                        times.append(time.perf_counter() - started)
                    out.append((rows, width, context, statistics.median(times)))
                    print(f"B {rows:2d}  L {width:2d}  T {context:5d}  "
                          f"{1000 * out[-1][3]:7.1f} ms", flush=True)
    return out


def fit(points: list[tuple[int, int, int, float]]) -> tuple[float, float, float]:
    x = np.array([[1.0, b * w, b * w * t / 1000] for b, w, t, _ in points])
    y = np.array([s for *_, s in points])
    (c0, c1, c2), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(c0), float(c1), float(c2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fp32-dir", required=True)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--widths", default="1,2,4,8")
    ap.add_argument("--contexts", default="128,512,1024")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    for name in ("rows", "widths", "contexts"):
        setattr(args, name, [int(v) for v in getattr(args, name).split(",")])
    points = run(args)
    c0, c1, c2 = fit(points)
    print(f"fit: c0 {1000 * c0:.1f} ms, c1 {1000 * c1:.2f} ms/position, "
          f"c2 {1000 * c2:.3f} ms/(position x 1000 context)")
    print(f"ratios: c1/c0 {c1 / c0:.3f}, c2/c0 {c2 / c0:.4f} per 1000 tokens of context")
    return 0


if __name__ == "__main__":
    sys.exit(main())
