"""Decode and prefill as the context grows: frink-mlx vs mlx_lm.server on the same weights (issue 31).

    .venv/bin/python benchmarks/long_context_bench.py                 # SmolLM2 fp32, 512 .. 8,000
    .venv/bin/python benchmarks/long_context_bench.py --tiny-32k      # a tiny random model, 32k window

What one run does:
1. Weights, in a subprocess (this client process never loads MLX): the default
   model (SmolLM2-135M, Q4_1 GGUF) converted once to a plain float32 MLX
   checkpoint (serve_bench.py's `make_fp32_dir`), so both servers load the
   identical fp32 weights. `--tiny-32k` instead writes a small random llama
   (`TINY_32K`: 4 layers, 1 KV head of 64, a 32,768-token window) with mlx-lm's
   own model class and SmolLM2's tokenizer.
2. Both servers start (frink-mlx with a pool of `--pool-mib`, so that C clients
   at the longest level fit) and are warmed; each level then runs on frink-mlx,
   then on mlx_lm.server, before the next (the machine drifts), so every pair
   of figures is measured back to back.
3. A level is C concurrent clients, each sending one chat request whose prompt
   is --level tokens (distinct random notes per server, level and client, cut
   to the length with the model's tokenizer; no prefix cache can hit), greedy,
   --tokens out. frink-mlx gets `ignore_eos`; mlx_lm.server cannot, so the prompt
   ends asking for a long story and short replies are counted.
   - TTFT: request sent -> first text chunk; the median over the level's requests.
   - decode tok/s: one client's (completion tokens - 1) over first -> last text
     chunk; C clients' tokens streamed while all C decode (from the last first
     chunk to the first last chunk) over that window: the batched decode rate,
     without the prefill steps of the others' prompts that frink-mlx interleaves
     with decode and mlx_lm.server runs before it. 4-client levels stream
     --tokens-4 tokens each so that such a window exists. frink-mlx interleaves
     the others' prefill with decode, so at long levels the first stream can end
     before the last one starts (no window); `--warm-4` then sends each prompt
     alone first (1 token out: both servers keep it in their prefix / prompt
     cache, mlx_lm.server up to --prompt-cache-size 10), so that the 4 streams
     start together from a cached prefix and the window is pure batched decode
     at that context. Such a level's TTFT is a cache hit's, not a prefill's.
     `--shared-4` draws the C prompts' notes from one tag, so they differ only
     in their last line: C requests over one long prefix, as an agent's
     parallel requests over one repository context are (frink-mlx reads the
     shared blocks once for all rows: kv/reads.py rule 5).
4. A table, and the issue's targets as ratios: decode at the longest levels
   (6,000+ tokens; 32k with --tiny-32k) / mlx_lm.server's (>= 1.1, per client
   count), frink-mlx's own decode at the longest level / at 512 (>= 0.6), TTFT
   ratios per level (prefill, to compare with earlier runs). The 1-minute load
   average is printed per level: on a shared machine read ratios, not rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import PYTHON, ROOT, Reply, Server, bench_env, chat_body, start_frink, start_mlx_lm, stream_chat

WORDS = ("amber basin cedar delta ember fjord garnet harbor island juniper kettle lantern meadow "
         "nickel orchard pebble quartz river saddle timber umber valley willow yarrow zephyr "
         "anchor bridge canyon dune falcon glacier hollow ivory jasper kestrel lagoon marble "
         "nutmeg opal prairie quill raven sierra thistle vesper walnut").split()
TINY_32K = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 4, "num_key_value_heads": 1, "intermediate_size": 1024,
            "rms_norm_eps": 1e-5, "rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
            "tie_word_embeddings": True, "hidden_act": "silu"}


def notes(tag: str, num_words: int) -> str:
    rng = random.Random(tag)
    words = [rng.choice(WORDS) for _ in range(num_words)]
    return " ".join(f"{w}." if i % 12 == 11 else w for i, w in enumerate(words))


def messages(tokenizer: Any, tag: str, num_tokens: int, notes_tag: str | None = None
             ) -> list[dict[str, str]]:
    """A user turn of about `num_tokens` tokens (the template adds a few): notes drawn from
    `notes_tag` (default `tag`), then an ask naming `tag`."""
    ask = f" [{tag}] Now write a long, detailed story in many paragraphs about these notes."
    budget = max(8, num_tokens - len(tokenizer.encode(ask).ids) - 24)
    ids = tokenizer.encode(notes(notes_tag or tag, budget * 2)).ids[:budget]
    return [{"role": "user", "content": "Notes: " + tokenizer.decode(ids) + ask}]


def decode_rate(replies: list[Reply]) -> float | None:
    """Step 3's decode tok/s: one stream's (n - 1) / (last - first); several streams' tokens
    inside the window where all of them decode, over its length (None: no such window)."""
    live = [r for r in replies if r.first and r.last and r.last > r.first and r.stamps]
    if len(live) != len(replies) or not live:
        return None
    if len(live) == 1:
        return ((live[0].completion_tokens or 0) - 1) / (live[0].last - live[0].first)  # type: ignore[operator]
    lo, hi = max(r.stamps[0] for r in live), min(r.stamps[-1] for r in live)
    if hi <= lo:
        return None
    per_stamp = [(r.completion_tokens or len(r.stamps)) / len(r.stamps) for r in live]
    inside = sum(k * sum(1 for t in r.stamps if lo < t <= hi) for k, r in zip(per_stamp, live))
    return inside / (hi - lo)


async def run_level(server: Server, tokenizer: Any, level: int, clients: int, tokens: int,
                    extra: dict[str, Any], warm: bool = False, shared: bool = False
                    ) -> dict[str, Any]:
    tag = f"{server.name}-{level}-{clients}-{random.random():.6f}"
    prompts = [messages(tokenizer, f"{tag}-{c}", level, tag if shared else None)
               for c in range(clients)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0)) as http:
        for prompt in prompts if warm else ():  # step 3's --warm-4: each prompt cached alone first
            await stream_chat(http, server, chat_body(server, prompt, 1, extra))
        replies = await asyncio.gather(*(stream_chat(http, server, chat_body(
            server, prompt, tokens, extra)) for prompt in prompts))
    failed = [r.error for r in replies if r.error or r.first is None]
    ok = [r for r in replies if not r.error and r.first is not None]
    return {"decode_tps": decode_rate(ok), "failed": failed,
            "ttft_s": statistics.median(r.ttft_s for r in ok) if ok else None,
            "prompt_tokens": max((r.prompt_tokens or 0) for r in ok) if ok else None,
            "short": sum(1 for r in ok if (r.completion_tokens or 0) < tokens), "requests": clients,
            "load": load_average()}


async def bench(servers: list[Server], tokenizer: Any, args: argparse.Namespace
                ) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    extras = {"frink-mlx": {"ignore_eos": True}, "mlx_lm.server": {}}
    for server in servers:  # warm-up: load, first shapes
        await run_level(server, tokenizer, 64, 1, 4, extras[server.name])
    out: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for clients, levels, tokens in ((1, args.levels, args.tokens), (4, args.levels_4, args.tokens_4)):
        for level in levels:
            for server in servers:
                res = await run_level(server, tokenizer, level, clients, tokens, extras[server.name],
                                      warm=clients > 1 and args.warm_4,
                                      shared=clients > 1 and args.shared_4)
                out.setdefault((clients, level), {})[server.name] = res
                print(f"  {server.name:14s} {clients} client(s) {level:6d} tokens: decode "
                      f"{fmt(res['decode_tps'], '.2f')} tok/s  TTFT {fmt(res['ttft_s'], '.2f')} s  "
                      f"(prompt {res['prompt_tokens']}, {res['short']}/{res['requests']} short, "
                      f"load {res['load']})" + (f"  FAILED {res['failed']}" if res["failed"] else ""),
                      flush=True)
    return out


def report(results: dict[tuple[int, int], dict[str, dict[str, Any]]], long_from: int) -> None:
    print("\n| clients | context | frink decode tok/s | mlx_lm decode tok/s | decode ratio | "
          "frink TTFT s | mlx_lm TTFT s | TTFT ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for (clients, level), pair in sorted(results.items()):
        f, m = pair.get("frink-mlx", {}), pair.get("mlx_lm.server", {})
        decode = ratio(f.get("decode_tps"), m.get("decode_tps"))
        print(f"| {clients} | {level} | {fmt(f.get('decode_tps'), '.2f')} | "
              f"{fmt(m.get('decode_tps'), '.2f')} | {fmt(decode, '.2f')} | "
              f"{fmt(f.get('ttft_s'), '.2f')} | {fmt(m.get('ttft_s'), '.2f')} | "
              f"{fmt(ratio(f.get('ttft_s'), m.get('ttft_s')), '.2f')} |")
    print("\nTargets (issue 31):")
    for clients in sorted({c for c, _ in results}):
        levels = sorted(lv for c, lv in results if c == clients)
        for level in [lv for lv in levels if lv >= long_from]:
            pair = results[(clients, level)]
            r = ratio(pair.get("frink-mlx", {}).get("decode_tps"),
                      pair.get("mlx_lm.server", {}).get("decode_tps"))
            print(f"  {clients} client(s), {level} tokens: decode / mlx_lm.server's = {fmt(r, '.2f')} "
                  f"(>= 1.1: {verdict(r, 1.1)})")
        if levels and levels[0] <= 512 and levels[-1] >= long_from:
            base = results[(clients, levels[0])].get("frink-mlx", {}).get("decode_tps")
            top = results[(clients, levels[-1])].get("frink-mlx", {}).get("decode_tps")
            r = ratio(top, base)
            print(f"  {clients} client(s): frink-mlx decode at {levels[-1]} / at {levels[0]} = "
                  f"{fmt(r, '.2f')} (>= 0.6: {verdict(r, 0.6)})")


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def verdict(value: float | None, line: float) -> str:
    return "n/a" if value is None else ("MET" if value >= line else "MISSED")


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def worker_prepare(args: argparse.Namespace) -> None:
    """Subprocess: the fp32 SmolLM2 dir, or the tiny 32k model beside it (step 1)."""
    from serve_bench import make_fp32_dir

    fp32 = Path(args.fp32_dir)
    if not (fp32 / "config.json").is_file():
        make_fp32_dir(None, fp32)
    if not args.tiny_32k:
        return
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    out = Path(args.tiny_dir)
    if (out / "config.json").is_file():
        return
    vocab = json.loads((fp32 / "config.json").read_text())["vocab_size"]
    config = {**TINY_32K, "vocab_size": vocab}
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.update(dict_of({k: mx.random.normal(v.shape) * 0.05 for k, v in
                          tree_flatten(model.parameters())}))
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config({**config, "architectures": ["LlamaForCausalLM"]}, out / "config.json")
    for src in fp32.iterdir():
        if src.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(src, out / src.name)


def dict_of(flat: dict[str, Any]) -> Any:
    from mlx.utils import tree_unflatten

    return tree_unflatten(list(flat.items()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp32-dir", default=str(Path(tempfile.gettempdir()) / "long-bench" / "smollm2-fp32"))
    ap.add_argument("--tiny-32k", action="store_true", help="the tiny random model, 512 and 32,000")
    ap.add_argument("--tiny-dir", default=str(Path(tempfile.gettempdir()) / "long-bench" / "tiny-32k"))
    ap.add_argument("--levels", default=None, help="1-client levels (tokens), comma-separated")
    ap.add_argument("--levels-4", default=None, help="4-client levels; empty: none")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--tokens-4", type=int, default=128, help="tokens out per client at 4 clients")
    ap.add_argument("--warm-4", action="store_true",
                    help="4-client levels: send each prompt alone first (1 token out), so that the "
                         "4 streams start from a cached prefix and decode together (step 3)")
    ap.add_argument("--shared-4", action="store_true",
                    help="4-client levels: the prompts share their notes and differ in the last "
                         "line (one long prefix under several requests, as agents send it)")
    ap.add_argument("--pool-mib", type=int, default=None, help="frink-mlx's --max-kv-pool-bytes")
    ap.add_argument("--only", choices=("frink", "mlx_lm"), default=None)
    ap.add_argument("--no-speculative", action="store_true",
                    help="frink-mlx without speculation (mlx_lm.server never speculates)")
    ap.add_argument("--worker-prepare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker_prepare:
        worker_prepare(args)
        return 0
    default_levels, default_4 = ("512,32000", "") if args.tiny_32k else \
        ("512,2048,4096,6800,8000", "512,8000")
    args.levels = [int(x) for x in (default_levels if args.levels is None else args.levels).split(",") if x]
    four = args.levels_4 if args.levels_4 is not None else default_4
    args.levels_4 = [int(x) for x in four.split(",") if x]
    cmd = [PYTHON, __file__, "--worker-prepare", "--fp32-dir", args.fp32_dir, "--tiny-dir", args.tiny_dir]
    done = subprocess.run(cmd + (["--tiny-32k"] if args.tiny_32k else []), env=bench_env(), cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"preparing the weights failed:\n{done.stderr[-3000:]}")
    model_dir = args.tiny_dir if args.tiny_32k else args.fp32_dir
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    window = 32768 if args.tiny_32k else 8192
    pool = args.pool_mib * 2**20 if args.pool_mib else 3 * 2**30
    models = Path(model_dir).parent / (Path(model_dir).name + "-models.toml")
    models.write_text(f'default = "long-bench"\n\n[models.long-bench]\nsource = "{model_dir}"\n'
                      f'dequantize = false\ncontext_length = {window}\ndescription = "long_context_bench"\n')
    print(f"model {model_dir}; levels 1 client {args.levels}, 4 clients {args.levels_4}; "
          f"{args.tokens} / {args.tokens_4} tokens out; load {load_average()}", flush=True)
    servers: list[Server] = []
    try:
        if args.only != "mlx_lm":
            servers.append(start_frink(str(models), "--max-kv-pool-bytes", str(pool),
                                       *(("--no-speculative",) if args.no_speculative else ())))
        if args.only != "frink":
            servers.append(start_mlx_lm(model_dir))
        results = asyncio.run(bench(servers, tokenizer, args))
    finally:
        for server in servers:
            server.stop()
    report(results, long_from=32000 if args.tiny_32k else 6000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
