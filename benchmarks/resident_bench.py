"""Several resident models (issue 19): fairness, the editor scenario, RSS over load/evict cycles.

Prints numbers; the checks the issue asks for are printed as PASS/FAIL lines, never
asserted (benchmarks are scripts, not timed tests). Models are random-weight llamas
written here (tests/conftest.py `make_tiny_llama`, sized by --hidden/--layers), served
by a real `frink-mlx serve` process over HTTP (_common.py).

    fairness  model A streams 4 answers; B then gets a ~2,000-token prompt. A's
              inter-token latency p95 while B prefills vs A alone (target <= 2x).
    editor    alternate a completion model and a chat model 20 times. Reloads
              after warm-up (target 0) and each model's median TTFT vs its single-model
              median (target within 10%), the two phases interleaved in 4 rounds
    rss       20 admin load + unload cycles of one model next to a resident one;
              RSS after each (target: the last within 10% of the first).

Usage: .venv/bin/python benchmarks/resident_bench.py [fairness|editor|rss|all]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from _common import ROOT, Server, chat_body, start_frink, stream_chat

sys.path.insert(0, str(ROOT / "tests"))
from conftest import make_tiny_llama  # noqa: E402 - the tests' checkpoint writer


def write_models(root: Path, names: list[str], hidden: int, layers: int) -> Path:
    shape = {"hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
             "num_attention_heads": 8, "num_key_value_heads": 4, "max_position_embeddings": 4096}
    lines = [f'default = "{names[0]}"']
    for seed, name in enumerate(names):
        path = make_tiny_llama(root / name, seed=seed, **shape)
        lines.append(f'[models.{name}]\nsource = "{path}"')
    path = root / "models.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def gaps(stamps: list[float], start: float, end: float) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:]) if start <= a and b <= end]


def as_model(server: Server, model: str) -> Server:
    return Server(server.name, server.proc, server.url, model, server.log_path)


MSG = [{"role": "user", "content": "Tell me a long story about the sea."}]


async def fairness(server: Server) -> dict[str, Any]:
    a, b = as_model(server, "model-a"), as_model(server, "model-b")
    long_prompt = [{"role": "user", "content": " ".join(f"w{i % 97}" for i in range(700))}]
    async with httpx.AsyncClient(timeout=600) as client:
        await stream_chat(client, b, chat_body(b, MSG, 2))  # both resident, warm
        await stream_chat(client, a, chat_body(a, MSG, 2))
        extra = {"ignore_eos": True}
        # long enough to outlast the idle window and B's prefill on a fast machine too
        streams = [asyncio.create_task(stream_chat(client, a, chat_body(a, MSG, 2000, extra)))
                   for _ in range(4)]
        await asyncio.sleep(6.0)                       # A alone: the idle window
        b_sent = time.perf_counter()
        b_reply = await stream_chat(client, b, chat_body(b, long_prompt, 1))
        b_first = b_reply.first or b_reply.done
        replies = await asyncio.gather(*streams)
    idle = [g for r in replies for g in gaps(r.stamps, b_sent - 5.0, b_sent)]
    during = [g for r in replies for g in gaps(r.stamps, b_sent, b_first)]
    return {"b_prompt_tokens": b_reply.prompt_tokens, "b_ttft_s": round(b_first - b_sent, 3),
            "a_itl_p95_idle_ms": round(1000 * p95(idle), 1),
            "a_itl_p95_during_b_prefill_ms": round(1000 * p95(during), 1),
            "samples_idle": len(idle), "samples_during": len(during),
            "ratio": round(p95(during) / p95(idle), 2)}


def generations(server: Server) -> dict[str, int]:
    info = httpx.get(server.url + "/admin/models", timeout=10).json()
    return {m["name"]: m["residency"]["generation"] for m in info["models"]}


ROUNDS = 4            # editor: 20 alternations in 4 rounds, each after single-model requests
SINGLE_PER_ROUND = 3  # per model and round


async def editor(server: Server) -> dict[str, Any]:
    fim, chat = as_model(server, "model-a"), as_model(server, "model-b")
    prompt = [{"role": "user", "content": "def add(a, b):"}]
    async with httpx.AsyncClient(timeout=600) as client:
        async def ttft(s: Server) -> float:
            return (await stream_chat(client, s, chat_body(s, prompt, 8))).ttft_s

        for s in (fim, chat):  # warm-up: both models resident, their prompts cached
            await ttft(s)
        before = generations(server)
        single: dict[str | None, list[float]] = {fim.model: [], chat.model: []}
        alternating: dict[str | None, list[float]] = {fim.model: [], chat.model: []}
        turn = 0
        for _ in range(ROUNDS):  # single-model and alternating phases interleaved, so a
            for s in (fim, chat):  # drifting machine load weighs on both alike
                single[s.model] += [await ttft(s) for _ in range(SINGLE_PER_ROUND)]
            for _ in range(20 // ROUNDS):
                s = fim if turn % 2 == 0 else chat
                turn += 1
                alternating[s.model].append(await ttft(s))
        after = generations(server)
    reloads = sum(1 for name in before if before[name] != after[name])
    base = {m: statistics.median(v) for m, v in single.items() if m}
    worst = {m: round(max(v) / base[m], 3) for m, v in alternating.items() if m}
    median = {m: round(statistics.median(v) / base[m], 3) for m, v in alternating.items() if m}
    return {"single_ttft_ms": {m: round(1000 * v, 1) for m, v in base.items()},
            "alternating_median_ttft_ms": {m: round(1000 * statistics.median(v), 1)
                                           for m, v in alternating.items() if m},
            "median_ratio": median, "worst_ratio": worst, "reloads": reloads}


def rss_bytes(server: Server) -> int:
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def settle(server: Server) -> int:
    while True:
        info = httpx.get(server.url + "/admin/models", timeout=10).json()
        if not info["retired"] and not info["releasing"]:
            return rss_bytes(server)
        time.sleep(0.05)


def rss_cycles(server: Server, cycles: int = 20) -> dict[str, Any]:
    samples = []
    for _ in range(cycles):
        r = httpx.post(server.url + "/admin/models/load", json={"model": "model-b", "wait": True},
                       timeout=600)
        r.raise_for_status()
        httpx.post(server.url + "/admin/models/unload", json={"model": "model-b"},
                   timeout=600).raise_for_status()
        samples.append(settle(server))
    return {"rss_after_first_mib": samples[0] // 2**20, "rss_after_last_mib": samples[-1] // 2**20,
            "max_mib": max(samples) // 2**20, "ratio": round(samples[-1] / samples[0], 3),
            "samples_mib": [s // 2**20 for s in samples]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("which", nargs="?", default="all", choices=["fairness", "editor", "rss", "all"])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        models = write_models(Path(tmp), ["model-a", "model-b"], args.hidden, args.layers)
        server = start_frink(str(models), "--max-batch", "8")
        try:
            checks = {
                "fairness": (lambda: asyncio.run(fairness(server)),
                             lambda r: r["ratio"] <= 2.0),
                "editor": (lambda: asyncio.run(editor(server)),
                           lambda r: r["reloads"] == 0 and max(r["median_ratio"].values()) <= 1.1),
                "rss": (lambda: rss_cycles(server), lambda r: r["ratio"] <= 1.1),
            }
            for name, (run, ok) in checks.items():
                if args.which not in (name, "all"):
                    continue
                result = run()
                print(name, result, flush=True)
                print(name, "PASS" if ok(result) else "FAIL", flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
