"""Speculative decoding on and off, one daemon, editor and chat workloads (issue 20).

What it measures, in one run on the fp32 SmolLM2 checkpoint (serve_bench.py's
conversion, reused with --fp32-dir):
1. One frink-mlx daemon with speculation enabled; the "off" runs send the
   request's own opt-out `speculative: false`, so both sides share the process,
   the weights and the machine's moment. Each side gets its own `cache_salt`,
   so neither reads the other's prefix cache.
2. Editor workload: the 20 code-editing requests of benchmarks/data/edit_prompts.json
   (rewrite a 40-120-line snippet with one identifier renamed), greedy.
   Chat workload: free-form story requests (serve_bench's), greedy.
3. Single stream: requests one at a time, off and on alternating per request
   (drift hits both sides alike); the rate is decode tok/s, (tokens - 1) over
   first-to-last token time, summed over requests. 8 clients: 8 concurrent
   streams share the requests; the rate is completion tokens / wall time. The
   requests run in two halves, off-on then on-off (A B B A), so a load that
   drifts during the run (the machine is shared) weighs on both sides alike.
4. Greedy output is the same with speculation on or off (the engine's
   guarantee): the script counts replies whose texts differ and prints it.
5. Acceptance: usage's `draft_tokens` / `draft_accepted` per workload.
6. Prefill bound (N clients): the workload's prompt tokens at the prefill
   rate single stream measured (prompt tokens / time to first token) give
   the seconds no decoding speed-up can save; wall / those seconds is the
   ratio infinitely fast decoding would reach. Only decoding speeds up.
7. Draft-model mode (`--draft-layers N`): the bench entry names a draft
   (registry rule 10), its own first N decoder layers (same embeddings, final
   norm and tokenizer), built next to the fp32 checkpoint. No second model
   with SmolLM2's tokenizer is installed on this machine, and a truncation
   is what there is; an untrained early exit agrees with the full model
   rarely, so this mode measures the draft model's overhead (and that the
   cost model and rule 2 switch a poor draft off), not a speed-up. The
   draft model's own drafted/accepted counts come from /metrics.
Targets (issue 20): edit single stream >= 2.0x, edit 8 clients >= 1.5x,
chat >= 0.95x. The load average is printed with the results; on a shared
2-core machine read the ratios as +-10%.

    .venv/bin/python benchmarks/spec_bench.py --fp32-dir /tmp/smollm2-fp32 --keep-weights
    .venv/bin/python benchmarks/spec_bench.py --quick   # 6 edit / 4 chat requests, 64 tokens
    .venv/bin/python benchmarks/spec_bench.py --fp32-dir /tmp/smollm2-fp32 --draft-layers 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import PYTHON, ROOT, Reply, Server, bench_env, chat_body, start_frink, stream_chat
from serve_bench import load_average, prepare, story_messages, write_models_toml

DATA = Path(__file__).with_name("data") / "edit_prompts.json"
RESULTS = Path(__file__).with_name("results")


def edit_messages() -> list[list[dict[str, str]]]:
    return [p["messages"] for p in json.loads(DATA.read_text())]


def chat_messages(num: int) -> list[list[dict[str, str]]]:
    return [story_messages("spec", i) for i in range(num)]


def body(server: Server, messages: list[dict[str, str]], tokens: int, spec: bool,
         salt: str) -> dict[str, Any]:
    return chat_body(server, messages, tokens, {"speculative": spec, "cache_salt": salt})


async def single_stream(server: Server, workload: list[list[dict[str, str]]], tokens: int,
                        salt: str) -> dict[bool, list[Reply]]:
    """Rule 3: one request at a time, off and on alternating."""
    out: dict[bool, list[Reply]] = {False: [], True: []}
    async with httpx.AsyncClient(timeout=None) as http:
        for i, messages in enumerate(workload):
            for spec in ((False, True) if i % 2 == 0 else (True, False)):
                out[spec].append(await stream_chat(
                    http, server, body(server, messages, tokens, spec, f"{salt}-{spec}")))
    return out


async def clients(server: Server, workload: list[list[dict[str, str]]], tokens: int,
                  spec: bool, num_clients: int, salt: str) -> tuple[list[Reply], float]:
    """Rule 3: `num_clients` concurrent streams over the workload; (replies, wall s)."""
    queue = list(enumerate(workload))
    replies: dict[int, Reply] = {}
    limits = httpx.Limits(max_connections=num_clients + 4)

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            i, messages = queue.pop(0)
            replies[i] = await stream_chat(http, server,
                                           body(server, messages, tokens, spec, salt))

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=None, limits=limits) as http:
        await asyncio.gather(*(client(http) for _ in range(num_clients)))
    return [replies[i] for i in sorted(replies)], time.perf_counter() - started


def decode_rate(replies: list[Reply]) -> float:
    tokens = sum(max(0, (r.completion_tokens or 0) - 1) for r in replies)
    seconds = sum((r.last or 0) - (r.first or 0) for r in replies if r.first is not None)
    return tokens / seconds if seconds > 0 else float("nan")


def prefill_rate(replies: list[Reply]) -> float | None:
    """Prompt tokens per second of time to first token, one request at a time."""
    tokens = sum(r.prompt_tokens or 0 for r in replies if r.first is not None)
    seconds = sum(r.ttft_s for r in replies if r.first is not None)
    return tokens / seconds if tokens and seconds > 0 else None


def prefill_bound(say: Any, replies: list[Reply], wall: float, rate: float | None) -> None:
    """Rule 6: how much of the off side's wall time its prompts alone would take."""
    if rate is None:
        return
    seconds = sum(r.prompt_tokens or 0 for r in replies) / rate
    say(f"    prefill alone (at the single-stream {rate:.0f} tok/s): {seconds:.0f} s of the off"
        f" side's {wall:.0f} s wall: infinitely fast decoding would give x{wall / seconds:.2f}")


def acceptance(replies: list[Reply]) -> str:
    drafted = sum(r.draft_tokens or 0 for r in replies)
    accepted = sum(r.draft_accepted or 0 for r in replies)
    tokens = sum(r.completion_tokens or 0 for r in replies)
    rate = f"{accepted / drafted:.0%}" if drafted else "n/a"
    return (f"drafted {drafted}, accepted {accepted} ({rate}); accepted drafts are "
            f"{accepted / tokens if tokens else 0:.0%} of the {tokens} output tokens")


def draft_model_counts(server: Server) -> tuple[float, float] | None:
    """(drafted, accepted) by the draft model so far, from /metrics (rule 7)."""
    text = httpx.get(server.url + "/metrics", timeout=30).text
    found = [[float(v) for v in re.findall(rf"^{name}_total(?:{{[^}}]*}})? (\S+)$", text, re.M)]
             for name in ("frink_spec_draft_model_tokens", "frink_spec_draft_model_accepted_tokens")]
    if not found[0] or not found[1]:
        return None
    return sum(found[0]), sum(found[1])  # over the resident models (labelled `model`)


def truncate(fp32_dir: str, num_layers: int) -> str:
    """Rule 7: the checkpoint's first `num_layers` layers, next to it (in a subprocess:
    MLX stays out of this client process)."""
    dst = f"{fp32_dir}-draft{num_layers}"
    code = ("import json, shutil, sys, mlx.core as mx\n"
            "from pathlib import Path\n"
            "src, dst, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])\n"
            "dst.mkdir(parents=True, exist_ok=True)\n"
            "w = {}\n"
            "for f in sorted(src.glob('*.safetensors')): w.update(mx.load(str(f)))\n"
            "w = {k: v for k, v in w.items() if not k.startswith('model.layers.')"
            " or int(k.split('.')[2]) < n}\n"
            "mx.save_safetensors(str(dst / 'model.safetensors'), w, metadata={'format': 'mlx'})\n"
            "c = json.loads((src / 'config.json').read_text()); c['num_hidden_layers'] = n\n"
            "(dst / 'config.json').write_text(json.dumps(c))\n"
            "for f in src.glob('tokenizer*'): shutil.copy(f, dst / f.name)\n")
    subprocess.run([PYTHON, "-c", code, fp32_dir, dst, str(num_layers)], check=True,
                   env=bench_env(), cwd=ROOT)
    return dst


def write_draft_models_toml(fp32_dir: str, draft_dir: str) -> str:
    path = Path(fp32_dir).parent / (Path(fp32_dir).name + "-draft-models.toml")
    path.write_text(f'default = "bench-fp32"\n\n[models.bench-fp32]\nsource = "{fp32_dir}"\n'
                    'dequantize = false\ndraft = "bench-draft"\n\n'
                    f'[models.bench-draft]\nsource = "{draft_dir}"\ndequantize = false\n')
    return str(path)


def differing(off: list[Reply], on: list[Reply]) -> int:
    return sum(1 for a, b in zip(off, on) if a.text != b.text)


def failures(*groups: list[Reply]) -> list[str]:
    return [r.error or "no text" for g in groups for r in g if r.error or r.first is None]


async def run_all(server: Server, args: argparse.Namespace, report: list[str]) -> None:
    def say(line: str) -> None:
        print(line, flush=True)
        report.append(line)

    edits = edit_messages()[:args.edit_requests]
    chats = chat_messages(args.chat_requests)
    targets = {"edit": (2.0, 1.5), "chat": (0.95, 0.95)}
    for name, workload, tokens in (("edit", edits, args.edit_tokens),
                                   ("chat", chats, args.chat_tokens)):
        if name not in args.workloads:
            continue
        say(f"\n== {name} workload: {len(workload)} requests, max_tokens {tokens}, greedy "
            f"(load {load_average()})")
        counts = draft_model_counts(server)
        one = await single_stream(server, workload[:args.single_requests], tokens, f"{name}-1")
        if one[True]:
            report_single(say, one, targets[name][0])
        groups: dict[bool, list[Reply]] = {False: [], True: []}
        walls = {False: 0.0, True: 0.0}
        first = (True, False) if args.on_first else (False, True)
        half = len(workload) // 2
        for part, order in ((workload[:half], first), (workload[half:], first[::-1])):
            for spec in order:  # rule 3: A B B A, so a drifting load hits both sides alike
                replies, wall = await clients(server, part, tokens, spec, args.clients,
                                              f"{name}-{args.clients}-{spec}")
                groups[spec] += replies
                walls[spec] += wall
        rates = {spec: sum(r.completion_tokens or 0 for r in groups[spec]) / walls[spec]
                 for spec in (False, True)}
        ratio = rates[True] / rates[False]
        streams = {spec: decode_rate(groups[spec]) for spec in (False, True)}
        ok = "MET" if ratio >= targets[name][1] else "MISSED"
        say(f"  {args.clients} clients      off {rates[False]:6.1f} tok/s   on {rates[True]:6.1f}"
            f" tok/s   x{ratio:.2f}   target >= {targets[name][1]}  {ok}   (load {load_average()})")
        say(f"    per-stream decode rate (first to last token): off {streams[False]:.1f}, "
            f"on {streams[True]:.1f} tok/s (x{streams[True] / streams[False]:.2f})")
        say(f"    on: {acceptance(groups[True])}")
        prefill_bound(say, groups[False], walls[False], prefill_rate(one[False]))
        say(f"    replies whose text differs off vs on: {differing(groups[False], groups[True])}"
            f" of {len(workload)}")
        after = draft_model_counts(server)
        if counts is not None and after is not None:
            drafted, accepted = after[0] - counts[0], after[1] - counts[1]
            say(f"    draft model ({name}, all phases): drafted {drafted:.0f}, accepted "
                f"{accepted:.0f} ({accepted / drafted if drafted else 0:.0%})")
        bad = failures(one[False], one[True], groups[False], groups[True])
        if bad:
            say(f"  FAILED requests: {len(bad)}: {bad[:3]}")


def report_single(say: Any, one: dict[bool, list[Reply]], target: float) -> None:
    off, on = decode_rate(one[False]), decode_rate(one[True])
    ok = "MET" if on / off >= target else "MISSED"
    say(f"  single stream  off {off:6.1f} tok/s   on {on:6.1f} tok/s   x{on / off:.2f}"
        f"   target >= {target}  {ok}")
    say(f"    on: {acceptance(one[True])}")
    say(f"    replies whose text differs off vs on: {differing(one[False], one[True])}"
        f" of {len(one[True])}")


def main() -> int:
    args = parse_args()
    report = [f"spec_bench {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  load {load_average()}  "
              f"clients {args.clients}"]
    print(report[0], flush=True)
    prep = prepare(argparse.Namespace(fp32_dir=args.fp32_dir, tokens=32, raw_batches=[1],
                                      model=None))
    line = (f"fp32 checkpoint {prep['dir']} ({prep['weights_mib']:.0f} MiB); bare model decode "
            f"batch 1: {prep['raw']['1']:.1f} tok/s")
    print(line, flush=True)
    report.append(line)
    models = write_models_toml(prep["dir"])
    if args.draft_layers:
        models = write_draft_models_toml(prep["dir"], truncate(prep["dir"], args.draft_layers))
        report.append(f"draft model: the checkpoint's first {args.draft_layers} layers (rule 7)")
    flags = ["--spec-max-rows", str(args.spec_max_rows)] if args.spec_max_rows else []
    if flags:
        report.append(f"spec_max_rows {args.spec_max_rows}")
    server = start_frink(models, *flags)
    try:
        asyncio.run(run_all(server, args, report))
    finally:
        server.stop()
    report.append(f"load average at the end: {load_average()}")
    if args.save:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / f"spec_bench-{time.strftime('%Y-%m-%d-%H%M')}.txt"
        out.write_text("\n".join(report) + "\n")
        print(f"saved {out}")
    if args.fp32_dir_is_temp:
        shutil.rmtree(Path(prep["dir"]).parent, ignore_errors=True)
    return 0


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="6 edit / 4 chat requests, 64 tokens")
    ap.add_argument("--fp32-dir", default=None, help="reuse/keep the fp32 checkpoint here")
    ap.add_argument("--keep-weights", action="store_true")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--single-requests", type=int, default=None,
                    help="single stream: only the first N requests of each workload (all; 0: none)")
    ap.add_argument("--workloads", default="edit,chat", help="comma list of edit, chat")
    ap.add_argument("--on-first", action="store_true", help="N clients: run 'on' before 'off'")
    ap.add_argument("--edit-requests", type=int, default=None, help="(20)")
    ap.add_argument("--chat-requests", type=int, default=None, help="(8)")
    ap.add_argument("--edit-tokens", type=int, default=None, help="max_tokens (128)")
    ap.add_argument("--chat-tokens", type=int, default=None, help="max_tokens (96)")
    ap.add_argument("--draft-layers", type=int, default=0,
                    help="rule 7: a draft model of the checkpoint's first N layers (0: none)")
    ap.add_argument("--spec-max-rows", type=int, default=None, help="the daemon's setting")
    ap.add_argument("--no-save", dest="save", action="store_false",
                    help="do not write benchmarks/results/spec_bench-DATE.txt")
    args = ap.parse_args()
    args.workloads = set(args.workloads.split(","))
    args.edit_requests = args.edit_requests or (6 if args.quick else 20)
    args.chat_requests = args.chat_requests or (4 if args.quick else 8)
    args.edit_tokens = args.edit_tokens or (64 if args.quick else 128)
    args.chat_tokens = args.chat_tokens or (64 if args.quick else 96)
    args.fp32_dir_is_temp = args.fp32_dir is None and not args.keep_weights
    if args.fp32_dir is None:
        args.fp32_dir = str(Path(tempfile.mkdtemp(prefix="spec-bench-")) / "smollm2-fp32")
    return args


if __name__ == "__main__":
    sys.exit(main())
