"""One model over two ranks vs one process: communication per step and decode tok/s.

Prints, for a random llama (default hidden 1024, 8 layers, 16/8 heads: both
divide by 2) served by the real engine:
1. all_sum latency (median) on this group's link for the sizes a decode step reduces
   (one row of the hidden state per sharded-to-all layer), for this model and
   for a 70B-class model (hidden 8192, bf16), plus one 256-token prefill chunk;
2. the plan broadcast (engine/channel.py) per step, for 1 and 8 rows;
3. decode tok/s and ms per step of the engine with 1 and 4 streams: one
   process (no group) vs rank 0 of two ranks (leader.py + follower.py), and
   the share of each step spent posting the plan;
4. the all-reduces one decode token needs in a 70B-class model, counted from
   the model file's own `shard` (mlx-lm llama, Llama-3-70B shape, built lazily:
   no weights are materialised), and their sizes.

benchmarks/results/dist-*.md turns 1 and 4 into the expected decode rate of a
70B model on two Macs over Thunderbolt 5.

Run from the repository root (each rank is a subprocess of this script, with
OpenBLAS preloaded, joined by MLX's ring backend over loopback):
    .venv/bin/python benchmarks/dist_bench.py [--tokens 64] [--hidden 1024] [--layers 8]
        [--split tensor|pipeline]
`--split pipeline` serves the same shape as a random qwen2 (llama has no
`pipeline`) split into two runs of layers (backend/distributed.py rule 3);
items 1, 2 and 4 are the same either way.
On this machine both ranks share the same cores, so two ranks cannot be faster
than one here: the numbers measure the overhead, not the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PYTHON, ROOT, bench_env  # noqa: E402

LLAMA_70B = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
             "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-5, "vocab_size": 128256, "rope_theta": 500000.0,
             "tie_word_embeddings": False}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- worker side (one process per rank) ------------------------------------------
def _model(args: argparse.Namespace) -> Any:
    import importlib

    import mlx.core as mx

    family = "qwen2" if args.split == "pipeline" else "llama"  # llama has no `pipeline`
    module = importlib.import_module(f"mlx_lm.models.{family}")
    mx.random.seed(0)  # the same weights on every rank
    config = {"model_type": family, "hidden_size": args.hidden, "num_hidden_layers": args.layers,
              "intermediate_size": args.hidden * 11 // 4, "num_attention_heads": 16,
              "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "vocab_size": 8192,
              "max_position_embeddings": 4096, "tie_word_embeddings": True}
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return model


def _allreduce_sizes(group: Any) -> dict[str, Any]:
    """Item 4: the sharded-to-all layers of a lazily built 70B llama and their outputs."""
    import mlx.nn as nn
    from mlx_lm.models import llama

    model = llama.Model(llama.ModelArgs.from_dict(LLAMA_70B))
    model.shard(group.group)  # lazily: only shapes are read, nothing is evaluated
    dims = [m.weight.shape[0] for _, m in model.named_modules()
            if isinstance(m, nn.ShardedToAllLinear)]
    return {"count": len(dims), "out_dims": sorted(set(dims))}


def _time_all_sum(group: Any, shape: tuple[int, ...], dtype: Any, reps: int) -> float:
    import mlx.core as mx

    x = mx.ones(shape, dtype=dtype)
    mx.eval(x)
    for _ in range(3):
        mx.eval(mx.distributed.all_sum(x, group=group.group, stream=mx.cpu))
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=group.group, stream=mx.cpu))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _micro(group: Any, hidden: int) -> dict[str, Any]:
    """Items 1-2 (every rank runs the same calls)."""
    import mlx.core as mx

    from frink_mlx.engine.channel import PlanChannel, Step
    from frink_mlx.engine.plan import DecodeRow, SchedulerOutput

    out: dict[str, Any] = {}
    for name, shape, dtype, reps in (
            (f"1 x {hidden} fp32 (this model, 1 row)", (1, hidden), mx.float32, 300),
            (f"4 x {hidden} fp32 (this model, 4 rows)", (4, hidden), mx.float32, 300),
            ("1 x 8192 fp32 (70B width, 1 row: 32 KiB)", (1, 8192), mx.float32, 300),
            ("1 x 8192 bf16 (70B, 1 row: 16 KiB)", (1, 8192), mx.bfloat16, 300),
            ("8 x 8192 bf16 (70B, 8 rows)", (8, 8192), mx.bfloat16, 200),
            ("256 x 8192 bf16 (70B prefill chunk: 4 MiB)", (256, 8192), mx.bfloat16, 20)):
        out[name] = _time_all_sum(group, shape, dtype, reps) * 1e6
    channel = PlanChannel(group, timeout_s=60, load_timeout_s=60, ping_s=3600)
    for rows in (1, 8):
        plan = SchedulerOutput(decode=[DecodeRow(i, 200 + i, list(range(64 * i, 64 * i + 64)), 17)
                                       for i in range(rows)])
        times = []
        for _ in range(200):
            started = time.perf_counter()
            if group.is_leader:
                channel.post(Step(1, plan))
            else:
                channel.receive()
            times.append(time.perf_counter() - started)
        out[f"plan broadcast, {rows} decode rows x 64 blocks"] = statistics.median(times) * 1e6
    return out


def _engine(model: Any, backend: Any, channel: Any) -> Any:
    from frink_mlx.engine.config import resolve_engine_config
    from frink_mlx.engine.engine import Engine, EngineConfig
    from frink_mlx.engine.gate import DecodeGate

    class Loaded:
        def __init__(self, m: Any) -> None:
            self.model = m

    config = EngineConfig(block_size=16, num_blocks=1024, max_batch=16, prefill_chunk_tokens=256,
                          batching=True, context_ceiling=4096, max_queue=64, queue_timeout_s=60,
                          generation=1, pipeline=False)
    loaded = Loaded(model)
    return Engine(loaded, resolve_engine_config(config, loaded, backend, distributed=True),
                  DecodeGate(), backend, channel=channel)


def _decode(engine: Any, streams: int, tokens: int) -> dict[str, float]:
    """Aggregate decode tok/s: from every row's first token to the last one."""
    import threading

    from frink_mlx.core.request import SamplingParams
    from frink_mlx.engine.types import SeqRequest

    firsts: list[float] = []
    lasts: list[float] = []

    def one(i: int) -> None:
        prompt = [(7 * i + j) % 8000 + 100 for j in range(32 + 8 * i)]
        stream = engine.submit(SeqRequest(request_id="", prompt_ids=prompt, max_tokens=tokens,
                                          sampling=SamplingParams(temperature=0)))
        first = None
        for _ in stream:
            first = first or time.perf_counter()
        firsts.append(first or time.perf_counter())
        lasts.append(time.perf_counter())

    steps0 = engine.stats().steps_total
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    span = max(lasts) - max(firsts)
    steps = engine.stats().steps_total - steps0
    return {"tok_s": streams * (tokens - 1) / span, "ms_per_step": span / max(1, tokens - 1) * 1e3,
            "steps": steps}


def worker(args: argparse.Namespace) -> None:
    from frink_mlx.backend import select_backend
    from frink_mlx.config import BackendConfig

    backend = select_backend(BackendConfig(use_openblas=False, cpu_matmul_parts=None))
    model = _model(args)
    result: dict[str, Any] = {"ranks": 1 if args.rank is None else 2}
    if args.rank is None:
        engine = _engine(model, backend, None)
        engine.start()
        result["decode"] = {n: _decode(engine, n, args.tokens) for n in (1, 4)}
        engine.shutdown(5)
        print(json.dumps(result), flush=True)
        return
    from frink_mlx.backend.distributed import GroupConfig, init_group, shard_model
    from frink_mlx.engine.channel import PlanChannel, Stop

    group = init_group(GroupConfig(hostfile=args.hostfile, rank=args.rank, backend="ring",
                                   split=args.split))
    result["micro_us"] = _micro(group, args.hidden)
    result["allreduce_70b"] = _allreduce_sizes(group)
    shard_model(model, group)
    channel = PlanChannel(group, timeout_s=120, load_timeout_s=120, ping_s=3600)
    if group.is_leader:
        engine = _engine(model, backend, channel)
        engine.start()
        result["decode"] = {}
        for n in (1, 4):
            posts, post_s = channel.posts_total, channel.post_s_total
            result["decode"][n] = _decode(engine, n, args.tokens)
            result["decode"][n]["post_ms"] = (channel.post_s_total - post_s) / max(
                1, channel.posts_total - posts) * 1e3
        engine.shutdown(5)  # posts Free(1)
        with channel.exclusive():
            channel.post(Stop())
        print(json.dumps(result), flush=True)
        return
    _follow(model, backend, channel)


def _follow(model: Any, backend: Any, channel: Any) -> None:
    from frink_mlx.engine.follower import Follower
    from frink_mlx.engine.kv.paged import PagedKVStore, model_kv_geometry
    from frink_mlx.engine.runner import Runner

    layers, heads, head_dim = model_kv_geometry(model)
    store = PagedKVStore(num_layers=layers, num_blocks=1024, block_size=16, n_kv_heads=heads,
                         head_dim=head_dim, dtype=model.model.embed_tokens.weight.dtype)
    follower = Follower(channel, lambda name: None)  # type: ignore[arg-type,return-value]
    follower.runners[1] = Runner(model, store, backend.prepare_decoder(model))
    follower.run()


# --- driver --------------------------------------------------------------------------
def _run(args: argparse.Namespace, ranks: int) -> dict[str, Any]:
    base = [PYTHON, __file__, "--worker", "--tokens", str(args.tokens), "--hidden",
            str(args.hidden), "--layers", str(args.layers), "--split", args.split]
    env = bench_env()
    if ranks == 1:
        out = subprocess.run(base, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as tmp:
        hostfile = Path(tmp) / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(ranks)]))
        procs = [subprocess.Popen([*base, "--hostfile", str(hostfile), "--rank", str(r)], env=env,
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True) for r in range(ranks)]
        out_text, _ = procs[0].communicate(timeout=1800)
        procs[1].wait(60)
    return json.loads(out_text.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--split", choices=["tensor", "pipeline"], default="tensor")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hostfile", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    family = "qwen2" if args.split == "pipeline" else "llama"
    print(f"# dist_bench: random {family} split {args.split}, hidden {args.hidden}, "
          f"{args.layers} layers, 16/8 heads, fp32, {args.tokens} tokens per stream; "
          f"CPU backend, ring over loopback; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    one, two = _run(args, 1), _run(args, 2)
    print("\n## all_sum latency on this link (median, us)")
    for name, us in two["micro_us"].items():
        print(f"{name:55s} {us:9.1f}")
    print("\n## decode (engine): 1 process vs 2 ranks")
    print(f"{'streams':>8} {'1 rank tok/s':>13} {'2 ranks tok/s':>14} {'1 rank ms/step':>15} "
          f"{'2 ranks ms/step':>16} {'plan post ms':>13}")
    for n in ("1", "4"):
        a, b = one["decode"][n], two["decode"][n]
        print(f"{n:>8} {a['tok_s']:13.1f} {b['tok_s']:14.1f} {a['ms_per_step']:15.2f} "
              f"{b['ms_per_step']:16.2f} {b['post_ms']:13.3f}")
    sizes = two["allreduce_70b"]
    print(f"\n## 70B-class (Llama-3-70B shape) sharded by the model file's shard(): "
          f"{sizes['count']} all-reduces per forward, outputs of {sizes['out_dims']} values per row")


if __name__ == "__main__":
    main()
