"""frink-mlx vs mlx_lm.server on the same fp32 weights, same streaming chat workload (issue 4).

    .venv/bin/python benchmarks/serve_bench.py [--quick] [--only frink|mlx_lm] [--profile DIR]

What one run does, in order (every process gets OpenBLAS preloaded and the
same OPENBLAS_CORETYPE, see _common.py):
1. Weights: the registry's default model (SmolLM2-135M, Q4_1 GGUF) is loaded
   by frink-mlx's loader with dequantize on and saved once as a plain float32
   MLX checkpoint dir (no `quantization` in config.json), so both servers load
   the identical fp32 dir and frink-mlx has nothing to dequantize.
2. Raw: in a subprocess, the bare mlx-lm model decodes greedily in a loop with
   a plain KVCache at batch 1/8/16 (engine_bench.raw_decode_tps): the ceiling
   any server on these kernels can reach. Timed again after both servers; a
   drift over 10% is flagged (the machine's load changed mid-run). Because it
   drifts, the rate at a level's batch size (1, 8, 16) is also timed right
   before that level (both servers up and idle), and the agg / raw target
   uses that adjacent figure; the run-start ratio is printed beside it.
3. Both servers start and warm up; they stay up together, but only one is ever
   sent work: each load level runs on frink-mlx, then on mlx_lm.server, before
   the next level (the machine's speed drifts by 10-20% over minutes here, so
   measuring one server after the other would compare different machines). An
   idle server's CPU use during the other's level is checked and printed if any.
   a. load: C concurrent clients (C in --clients), each sending --requests
      streaming chat requests one after the other, --tokens output tokens each,
      greedy. Aggregate output tok/s = all completion tokens (usage) / wall time
      from the first request sent to the last stream closed. TTFT = request
      sent -> first text chunk; p50/p95 over every request of that level.
      frink-mlx gets `ignore_eos`; mlx_lm.server has no such field, so the
      prompts ask for long stories (greedy SmolLM2 runs past 64 tokens on
      them) and the replies that ended short are counted and printed.
   b. turns: one client, a ~--history-tokens document + question (turn 1),
      then the same history + turn 1's answer + a new question (turn 2);
      ratio = turn-2 TTFT / turn-1 TTFT, median over --turn-trials documents
      (each new, so only turn 2 can hit a prefix cache).
   c. KV (frink-mlx only): 8 concurrent requests with prompts of different
      lengths; /health is polled while they decode. Formula printed below.
4. A table per server, the targets of issue 4 as ratios, and (with --profile)
   a py-spy profile of the daemon during an extra, unmeasured 8-client run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import (
    PYTHON,
    ROOT,
    Reply,
    Server,
    bench_env,
    chat_body,
    percentile,
    start_frink,
    start_mlx_lm,
    stream_chat,
    summarize_collapsed,
)

ANIMALS = ["dragon", "otter", "heron", "badger", "lynx", "walrus", "gecko", "raven", "bison",
           "koala", "ferret", "moose"]
SKILLS = ("bake bread", "play the violin", "sail a boat", "build a clock", "paint murals",
          "grow tomatoes", "write poems", "repair bicycles")
ROOMS = ["library", "kitchen", "attic", "cellar", "workshop", "greenhouse", "studio", "observatory"]


def story_messages(tag: str, i: int) -> list[dict[str, str]]:
    animal, skill = ANIMALS[i % len(ANIMALS)], SKILLS[(i * 5 + len(tag)) % len(SKILLS)]
    return [{"role": "user", "content": f"[{tag}-{i}] Write a long, detailed story in many "
                                        f"paragraphs about a {animal} who learns to {skill}."}]


def document(trial: int, num_sentences: int) -> str:
    """Deterministic notes, about 30 tokens per sentence; each trial starts differently."""
    lines = [f"Inspection log {trial * 7919 + 13} of the old manor."]
    for k in range(num_sentences):
        room, animal = ROOMS[(k * 3 + trial) % len(ROOMS)], ANIMALS[(k + trial) % len(ANIMALS)]
        lines.append(f"Note {k + 1}: in the {room} a {animal} was seen at {(k * 37) % 24:02d}:"
                     f"{(k * 11) % 60:02d}, carrying item number {k * 13 + trial}.")
    return " ".join(lines)


# ---------------------------------------------------------------- phase a: concurrent load
async def run_level(server: Server, clients: int, requests: int, tokens: int,
                    extra: dict[str, Any]) -> list[Reply]:
    async def client(c: int, http: httpx.AsyncClient) -> list[Reply]:
        return [await stream_chat(http, server, chat_body(
                    server, story_messages(f"c{clients}", c * requests + j), tokens, extra))
                for j in range(requests)]

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(timeout=None, limits=limits) as http:
        per_client = await asyncio.gather(*(client(c, http) for c in range(clients)))
    return [r for rs in per_client for r in rs]


def summarize_level(replies: list[Reply], tokens: int, cpu_s: float | None) -> dict[str, Any]:
    failed = [r.error or "no text" for r in replies if r.error or r.first is None]
    total = sum(r.completion_tokens or 0 for r in replies)
    wall = max(r.done for r in replies) - min(r.sent for r in replies)
    ttfts = [r.ttft_s for r in replies if r.first is not None] or [float("nan")]
    return {"agg_tps": total / wall, "ttft_p50": percentile(ttfts, 50),
            "ttft_p95": percentile(ttfts, 95), "tokens": total,
            "short": sum(1 for r in replies if (r.completion_tokens or 0) < tokens),
            "requests": len(replies), "failed": failed,
            "cpu_ms_per_token": None if cpu_s is None or not total else cpu_s * 1000 / total}


# ---------------------------------------------------------------- phase b: multi-turn TTFT
async def run_turns(server: Server, history_tokens: int, trials: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=None) as http:
        for trial in range(trials):
            turn1 = [{"role": "user", "content": document(trial, max(1, history_tokens // 30)) +
                      "\n\nQuestion: which animals were seen in the library?"}]
            first = await stream_chat(http, server, chat_body(server, turn1, 64))
            turn2 = turn1 + [{"role": "assistant", "content": first.text},
                             {"role": "user", "content": "And which were seen in the attic?"}]
            second = await stream_chat(http, server, chat_body(server, turn2, 16))
            rows.append({"t1": first.ttft_s, "t2": second.ttft_s, "p1": first.prompt_tokens,
                         "p2": second.prompt_tokens, "cached2": second.cached_tokens})
    return {"ratio": statistics.median(r["t2"] / r["t1"] for r in rows),
            "t1": statistics.median(r["t1"] for r in rows),
            "t2": statistics.median(r["t2"] for r in rows), "rows": rows}


# ---------------------------------------------------------------- phase c: KV held / needed
KV_FORMULA = """\
KV held / needed (frink-mlx): while 8 requests decode, /health is polled. A poll counts
only if its `running` equals the number of requests known (from the client's clock) to be
in decode for the whole poll, and the queue is empty. Then
  held   = kv.blocks_used x block_size x bytes_per_token
  needed = sum over those requests of (prompt_tokens + tokens received so far) x bytes_per_token
  bytes_per_token = 2 (K,V) x layers x kv_heads x head_dim x 4 (fp32)
The ratio is the mean over counted polls (<1 is possible: blocks of a shared prefix, e.g.
the chat template's system prompt, are held once but needed by every row). The pool
itself is preallocated at load; its size is printed separately."""


async def run_kv(server: Server, tokens: int) -> dict[str, Any]:
    polls: list[tuple[float, float, dict[str, Any]]] = []
    stop = asyncio.Event()

    async def poll(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            body = (await http.get(server.url + "/health")).json()
            polls.append((t0, time.perf_counter(), body))
            await asyncio.sleep(0.1)

    # ~100 .. ~520 prompt tokens: ragged, yet little enough prefill that no request outwaits
    # the daemon's queue timeout on a slow CPU
    sizes = [2, 4, 6, 8, 10, 12, 14, 16]
    async with httpx.AsyncClient(timeout=None) as http:
        poller = asyncio.create_task(poll(http))
        replies = await asyncio.gather(*(stream_chat(http, server, chat_body(
            server, [{"role": "user", "content": document(100 + i, n) + "\nSummarize."}],
            tokens, {"ignore_eos": True})) for i, n in enumerate(sizes)))
        stop.set()
        await poller
    return kv_ratio(polls, list(replies))


def kv_ratio(polls: list[tuple[float, float, dict[str, Any]]], replies: list[Reply]) -> dict[str, Any]:
    ratios, pool = [], None
    for t0, t1, body in polls:
        kv = body.get("kv") or {}
        pool = kv.get("blocks_total"), kv.get("block_size")
        live = [r for r in replies if r.first is not None and r.first < t0 and r.done > t1]
        if not live or body.get("running") != len(live) or body.get("queue_depth"):
            continue
        mid = (t0 + t1) / 2
        needed = sum((r.prompt_tokens or 0) + sum(1 for s in r.stamps if s <= mid) for r in live)
        ratios.append(kv["blocks_used"] * kv["block_size"] / needed)
    return {"ratio": statistics.mean(ratios) if ratios else None, "polls": len(ratios),
            "pool": pool, "prompt_tokens": [r.prompt_tokens for r in replies],
            "failed": [r.error for r in replies if r.error]}


# ---------------------------------------------------------------- all servers, all phases
async def bench_all(servers: list[Server], args: argparse.Namespace, extras: dict[str, dict[str, Any]],
                    raw_near: dict[int, float]) -> dict[str, dict[str, Any]]:
    """Every phase, the servers taking turns level by level (step 3 of the docstring);
    the raw rate at a level's batch size is measured again right before that level."""
    out: dict[str, dict[str, Any]] = {s.name: {"levels": {}} for s in servers}
    for server in servers:
        await run_level(server, 2, 1, 8, extras[server.name])  # warm-up: load, first batch shapes
    for clients in args.clients:
        if clients in args.raw_batches:
            raw_near[clients] = await asyncio.to_thread(raw_rate, args, clients)
            print(f"  raw decode batch {clients} (just before this level): "
                  f"{raw_near[clients]:.1f} tok/s", flush=True)
        for server in servers:
            idle = [(o, o.cpu_s()) for o in servers if o is not server]
            lvl = await measure_level(server, clients, args, extras[server.name])
            out[server.name]["levels"][clients] = lvl
            for other, cpu0 in idle:
                cpu1 = other.cpu_s()
                if cpu0 is not None and cpu1 is not None and cpu1 - cpu0 > 0.5:
                    print(f"    note: idle {other.name} used {cpu1 - cpu0:.1f} s CPU meanwhile")
    for server in servers:
        out[server.name]["turns"] = await measure_turns(server, args)
    for server in servers:
        if server.name == "frink-mlx":
            out[server.name].update(await measure_kv(server, args, extras[server.name]))
    return out


async def measure_level(server: Server, clients: int, args: argparse.Namespace,
                        extra: dict[str, Any]) -> dict[str, Any]:
    cpu0 = server.cpu_s()
    replies = await run_level(server, clients, args.requests, args.tokens, extra)
    cpu1 = server.cpu_s()
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    lvl = summarize_level(replies, args.tokens, cpu)
    print(f"  {server.name:14s} {clients:2d} clients: {lvl['agg_tps']:6.2f} tok/s  TTFT p50 "
          f"{lvl['ttft_p50']:.2f} s p95 {lvl['ttft_p95']:.2f} s  ({lvl['tokens']} tokens, "
          f"{lvl['short']}/{lvl['requests']} replies short, server CPU "
          f"{fmt(lvl['cpu_ms_per_token'], '.0f')} ms/token, load {load_average()})", flush=True)
    for error in lvl["failed"]:
        print(f"    FAILED request: {error}", flush=True)
    return lvl


async def measure_turns(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    turns = await run_turns(server, args.history_tokens, args.turn_trials)
    for row in turns["rows"]:
        print(f"  {server.name:14s} turns: prompt {row['p1']} -> {row['p2']} tokens, cached "
              f"{row['cached2']}; TTFT {row['t1']:.3f} s -> {row['t2']:.3f} s "
              f"({row['t2'] / row['t1']:.3f})", flush=True)
    return turns


async def measure_kv(server: Server, args: argparse.Namespace,
                     extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"kv": await run_kv(server, args.tokens)}
    print(f"  {server.name:14s} KV held/needed {fmt(out['kv']['ratio'], '.3f')} over "
          f"{out['kv']['polls']} polls (prompts {out['kv']['prompt_tokens']})", flush=True)
    for error in out["kv"]["failed"]:
        print(f"    FAILED request: {error}", flush=True)
    if args.profile:
        out["profile"] = await profile_level(server, args, extra)
    return out


async def profile_level(server: Server, args: argparse.Namespace, extra: dict[str, Any]) -> str:
    """py-spy record on the daemon during one more (unmeasured) 8-client level."""
    spy = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not Path(spy).exists():
        return "py-spy not installed (pip install py-spy)"
    out = Path(args.profile) / "frink-8-clients.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        spy, "record", "-p", str(server.pid), "-r", "50", "--threads", "--idle", "-f", "raw",
        "-o", str(out), "--nonblocking", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    await asyncio.sleep(1.0)
    await run_level(server, 8, args.requests, args.tokens, extra)
    proc.send_signal(signal.SIGINT)
    await proc.wait()
    return summarize_collapsed(out)


# ---------------------------------------------------------------- weights + raw decode
def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Steps 1-2 in a subprocess (MLX stays out of this client process)."""
    cmd = [PYTHON, __file__, "--worker-prepare", "--fp32-dir", args.fp32_dir,
           "--tokens", str(args.tokens), "--raw-batches", ",".join(map(str, args.raw_batches))]
    if args.model:
        cmd += ["--model", args.model]
    done = subprocess.run(cmd, check=False, env=bench_env(), cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"preparing the fp32 checkpoint failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def raw_rate(args: argparse.Namespace, batch: int) -> float:
    """The raw decode rate at `batch`, measured now (in a subprocess, as `prepare`)."""
    one = argparse.Namespace(**{**vars(args), "raw_batches": [batch]})
    return float(prepare(one)["raw"][str(batch)])


def worker_prepare(args: argparse.Namespace) -> None:
    """Runs in the subprocess: make (or reuse) the fp32 dir, then time the raw decode loop."""
    import mlx.core as mx
    from engine_bench import raw_decode_tps
    from mlx_lm import load

    out = Path(args.fp32_dir)
    if not (out / "config.json").is_file():
        make_fp32_dir(args.model, out)
    model = load(str(out))[0]
    config = json.loads((out / "config.json").read_text())
    if "quantization" in config or "quantization_config" in config:
        raise SystemExit(f"{out}: config.json still says quantized")
    vocab = int(config["vocab_size"])
    raw = {b: max(raw_decode_tps(model, b, args.tokens, 32, vocab) for _ in range(2))
           for b in args.raw_batches}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim * 4
    weights = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    del model
    mx.clear_cache()
    print(json.dumps({"dir": str(out), "raw": raw, "bytes_per_token": per_token,
                      "weights_mib": weights / 2**20}))


def make_fp32_dir(model_name: str | None, out: Path) -> None:
    """Registry entry -> frink's loader with dequantize on -> a plain fp32 MLX checkpoint dir."""
    from mlx_lm.utils import save_config, save_model

    from frink_mlx.backend import select_backend
    from frink_mlx.models.loader import load_model
    from frink_mlx.registry import load_registry
    from frink_mlx.settings import Settings

    settings = Settings.load(dequantize=True)
    loaded = load_model(load_registry(settings).resolve(model_name), settings.load_config(),
                        select_backend(settings.backend_config()))
    if str(loaded.dtype) != "mlx.core.float32":
        raise SystemExit(f"expected float32 weights after dequantize, got {loaded.dtype}")
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, loaded.model)
    config = {k: v for k, v in loaded.config.items()
              if k not in ("quantization", "quantization_config")}
    save_config(config, out / "config.json")
    for src in loaded.path.iterdir():
        if src.name.startswith(("tokenizer", "special_tokens", "generation_config", "chat_template")):
            shutil.copy(src, out / src.name)


def write_models_toml(fp32_dir: str) -> str:
    path = Path(fp32_dir).parent / (Path(fp32_dir).name + "-models.toml")
    path.write_text(f'default = "bench-fp32"\n\n[models.bench-fp32]\nsource = "{fp32_dir}"\n'
                    'dequantize = false\ndescription = "serve_bench fp32 checkpoint"\n')
    return str(path)


# ---------------------------------------------------------------- report
def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def print_report(results: dict[str, dict[str, Any]], raw: dict[int, float],
                 prep: dict[str, Any], args: argparse.Namespace, near: dict[int, float]) -> None:
    names = list(results)
    print("\n" + "=" * 78)
    print(f"{'':34s}" + "".join(f"{n:>16s}" for n in names))
    for c in args.clients:
        row = [results[n]["levels"][c] for n in names]
        print(f"agg output tok/s, {c:2d} clients{'':11s}" + "".join(f"{r['agg_tps']:16.1f}" for r in row))
        print(f"  TTFT p50 / p95 (s){'':15s}" +
              "".join(f"{r['ttft_p50']:9.2f} /{r['ttft_p95']:5.2f}" for r in row))
    print(f"turn-1 TTFT (s, ~{args.history_tokens} tok history){'':1s}" +
          "".join(f"{results[n]['turns']['t1']:16.3f}" for n in names))
    print(f"turn-2 TTFT (s){'':19s}" + "".join(f"{results[n]['turns']['t2']:16.3f}" for n in names))
    print(f"turn-2 / turn-1 TTFT (median){'':5s}" +
          "".join(f"{results[n]['turns']['ratio']:16.3f}" for n in names))
    print(f"KV held / needed{'':18s}" +
          "".join(f"{fmt(results[n].get('kv', {}).get('ratio'), '.3f'):>16s}" for n in names))
    print("raw decode tok/s (bare model)     " + "  ".join(f"batch {b}: {v:.1f}" for b, v in raw.items()))
    kv = results.get("frink-mlx", {}).get("kv")
    if kv and kv["pool"][0]:
        total, size = kv["pool"][:2]
        print(f"frink-mlx KV pool preallocated: {total} blocks x {size} tokens = "
              f"{total * size * prep['bytes_per_token'] / 2**20:.0f} MiB")
    print("mlx_lm.server exposes no KV counters: its KV held/needed is not measured.")
    print(KV_FORMULA)
    if near:
        print("raw decode tok/s, each just before its level: " +
              "  ".join(f"batch {b}: {v:.1f}" for b, v in near.items()))
    print_targets(results, raw, args, near)
    if results.get("frink-mlx", {}).get("profile"):
        print("\npy-spy profile of the daemon during an extra 8-client run:")
        print(results["frink-mlx"]["profile"])


def print_targets(results: dict[str, dict[str, Any]], raw: dict[int, float],
                  args: argparse.Namespace, near: dict[int, float]) -> None:
    frink, mlx = results.get("frink-mlx"), results.get("mlx_lm.server")

    def level(res: dict[str, Any] | None, c: int, key: str) -> float | None:
        return res["levels"][c][key] if res and c in res["levels"] else None

    def turns(res: dict[str, Any] | None, key: str = "ratio") -> float | None:
        return float(res["turns"][key]) if res else None

    kv = frink.get("kv", {}).get("ratio") if frink else None
    rows: list[tuple[str, float | None, str, float]] = [
        ("agg@8 frink / raw batch-8 (adjacent)", ratio(level(frink, 8, "agg_tps"), near.get(8)), ">=", 0.95),
        ("agg@8 frink / raw batch-8 (run start)", ratio(level(frink, 8, "agg_tps"), raw.get(8)), "info", 0),
        ("agg@8 frink / mlx_lm.server",
         ratio(level(frink, 8, "agg_tps"), level(mlx, 8, "agg_tps")), ">=", 1.15),
        ("agg@16 frink / mlx_lm.server",
         ratio(level(frink, 16, "agg_tps"), level(mlx, 16, "agg_tps")), ">=", 1.2),
        ("agg@16 mlx_lm.server / raw batch-16", ratio(level(mlx, 16, "agg_tps"),
                                                      near.get(16) or raw.get(16)), "info", 0),
        ("TTFT p95@8 frink / mlx_lm.server",
         ratio(level(frink, 8, "ttft_p95"), level(mlx, 8, "ttft_p95")), "<=", 0.5),
        ("turn-2/turn-1 TTFT frink", turns(frink), "<=", 0.05),
        ("turn-2/turn-1 TTFT mlx_lm.server", turns(mlx), "info", 0),
        ("turn-2 TTFT frink / mlx_lm.server", ratio(turns(frink, "t2"), turns(mlx, "t2")), "<", 1.0),
        ("KV held / needed frink", kv, "<=", 1.1),
    ]
    print("\nissue-4 targets")
    for name, value, op, target in rows:
        if op == "info":
            verdict = ""
        elif value is None:
            verdict = "not measured in this run"
        else:
            ok = {">=": value >= target, "<=": value <= target, "<": value < target}[op]
            verdict = f"target {op} {target:.3g}  {'MET' if ok else 'MISSED'}"
        print(f"  {name:38s} {fmt(value, '.3f'):>8s}   {verdict}")


def load_average() -> str:
    """The 1-minute load average (Linux), so a reader can see a noisy neighbour."""
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> int:
    args = parse_args()
    if args.worker_prepare:
        worker_prepare(args)
        return 0
    print(f"serve_bench {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  tokens/request {args.tokens}  "
          f"requests/client {args.requests}  clients {args.clients}", flush=True)
    prep = prepare(args)
    print(f"fp32 checkpoint {prep['dir']} ({prep['weights_mib']:.0f} MiB weights)  "
          f"KV {prep['bytes_per_token']} bytes/token", flush=True)
    raw = {int(k): v for k, v in prep["raw"].items()}
    print("raw decode (bare mlx-lm model, KVCache loop): " +
          "  ".join(f"batch {b}: {v:.1f} tok/s" for b, v in raw.items()), flush=True)
    models_toml = write_models_toml(prep["dir"])
    servers: list[Server] = []
    try:
        if args.only in (None, "frink"):
            servers.append(start_frink(models_toml))
        if args.only in (None, "mlx_lm"):
            servers.append(start_mlx_lm(prep["dir"]))
        extras = {"frink-mlx": {"ignore_eos": True}, "mlx_lm.server": {}}
        raw_near: dict[int, float] = {}
        results = asyncio.run(bench_all(servers, args, extras, raw_near))
    finally:
        for server in servers:
            server.stop()
    after = {int(k): v for k, v in prepare(args)["raw"].items()}
    print("raw decode again after the servers: " +
          "  ".join(f"batch {b}: {v:.1f} tok/s" for b, v in after.items()), flush=True)
    print_report(results, raw, prep, args, raw_near)
    drift = max(abs(after[b] / raw[b] - 1) for b in raw)
    if drift > 0.1:
        print(f"\nWARNING: the raw rate moved {drift:.0%} between the start and the end of this "
              "run: the machine's load changed, so the ratios above are unreliable.")
    if not args.keep_weights and args.fp32_dir_is_temp:
        shutil.rmtree(Path(prep["dir"]).parent, ignore_errors=True)
    return 0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 and 4 clients, 32 tokens, 1 trial")
    ap.add_argument("--only", choices=["frink", "mlx_lm"], default=None)
    ap.add_argument("--model", default=None, help="registry entry to convert (default: the default)")
    ap.add_argument("--fp32-dir", default=None, help="reuse/keep the fp32 checkpoint here")
    ap.add_argument("--keep-weights", action="store_true")
    ap.add_argument("--clients", default=None, help="comma list (default 1,4,8,16)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--tokens", type=int, default=None, help="output tokens per request (64)")
    ap.add_argument("--history-tokens", type=int, default=1000)
    ap.add_argument("--turn-trials", type=int, default=None, help="documents for turn-2/turn-1 (3)")
    ap.add_argument("--profile", default=None, help="py-spy the daemon at 8 clients into DIR")
    ap.add_argument("--worker-prepare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--raw-batches", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_prepare:
        args.raw_batches = [int(b) for b in args.raw_batches.split(",")]
        return args
    args.clients = [int(c) for c in (args.clients or ("1,4" if args.quick else "1,4,8,16")).split(",")]
    args.tokens = args.tokens or (32 if args.quick else 64)
    args.turn_trials = args.turn_trials or (1 if args.quick else 3)
    args.raw_batches = [1, 4] if args.quick else [1, 8, 16]
    args.fp32_dir_is_temp = args.fp32_dir is None
    if args.fp32_dir is None:
        args.fp32_dir = str(Path(tempfile.mkdtemp(prefix="serve-bench-")) / "smollm2-fp32")
    return args


if __name__ == "__main__":
    sys.exit(main())
