"""Client-side plumbing shared by the HTTP benchmarks: server processes and a streaming chat client.

Why a separate module: a benchmark that compares servers must start each one
the same way (same interpreter, same OpenBLAS preload, same readiness rule) and
time every request with the same clock and the same definition of "first
token". Keeping that here lets each script read as its workload.

Rules:
1. Every server runs in its own subprocess with `OPENBLAS` in LD_PRELOAD (the
   daemon would re-exec itself with it anyway; mlx_lm.server would not) and the
   same `OPENBLAS_CORETYPE` the daemon's re-exec would choose (engine/blas.py
   rule 5), so every process runs the same BLAS kernels.
2. Readiness: frink-mlx prints one JSON ready line on stdout (cli/serve.py rule 3);
   mlx_lm.server prints nothing machine-readable, so it is polled on /health
   until it answers 200 and then warmed with a request (it loads lazily).
   Each server's stderr goes to a temp log file, shown when a start fails.
3. TTFT = request sent -> first SSE chunk whose delta carries text. Token counts
   come from the final usage chunk (`stream_options.include_usage`), never from
   counting chunks (a server may merge tokens into one chunk).
4. The client side is one asyncio loop with httpx (no threads), so N "clients" are
   N concurrent streams on one connection pool, not N processes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from frink_mlx.backend.cpu.blas import suggested_coretype  # noqa: E402 - after the path entry

OPENBLAS = "/usr/lib/x86_64-linux-gnu/libopenblas.so.0"
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable


def bench_env(**extra: str) -> dict[str, str]:
    """This environment plus the OpenBLAS preload and the repo on PYTHONPATH (rule 1)."""
    env = dict(os.environ)
    if Path(OPENBLAS).exists() and "libopenblas" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = f"{OPENBLAS}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else OPENBLAS
    if "OPENBLAS_CORETYPE" not in env and Path(OPENBLAS).exists():
        core = suggested_coretype(Path(OPENBLAS))
        if core:
            env["OPENBLAS_CORETYPE"] = core
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A benchmarked server process."""

    name: str
    proc: subprocess.Popen[str]
    url: str
    model: str | None  # the `model` field to send; None = leave it out
    log_path: Path | None = None  # the server's stderr

    def cpu_s(self) -> float | None:
        """User + system CPU seconds the server process has used (Linux /proc; else None)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_chars:] if self.log_path else ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _log_file(name: str) -> tuple[Path, Any]:
    path = Path(tempfile.gettempdir()) / f"bench-{name}-{os.getpid()}.log"
    return path, path.open("w")


def start_frink(models_path: str, *extra_args: str) -> Server:
    """`frink-mlx serve --port 0` on `models_path`; waits for its ready line (rule 2)."""
    argv = [PYTHON, "-m", "frink_mlx.cli", "serve", "--port", "0", "--log-level", "warning",
            "--models", models_path, *extra_args]
    log_path, log = _log_file("frink")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                            env=bench_env())
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.wait(10)
        raise SystemExit(f"frink-mlx serve did not start (exit {proc.returncode}):\n"
                         f"{log_path.read_text()[-3000:]}")
    return Server("frink-mlx", proc, json.loads(line)["url"], "default", log_path)


def start_mlx_lm(model_dir: str, timeout_s: float = 300.0) -> Server:
    """`python -m mlx_lm.server --model DIR` on a free port; polls /health (rule 2)."""
    port = free_port()
    argv = [PYTHON, "-m", "mlx_lm.server", "--model", model_dir, "--port", str(port),
            "--log-level", "WARNING"]
    log_path, log = _log_file("mlx_lm")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, text=True, cwd=ROOT,
                            env=bench_env())
    return wait_healthy(Server("mlx_lm.server", proc, f"http://127.0.0.1:{port}", None, log_path),
                        timeout_s)


def wait_healthy(server: Server, timeout_s: float) -> Server:
    """`server` once its /health answers 200 (rule 2); exits with its log if it dies first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise SystemExit(f"{server.name} exited with {server.proc.returncode}:\n"
                             f"{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.proc.kill()
    raise SystemExit(f"{server.name} did not answer /health in time")


@dataclass
class Reply:
    """One streamed chat completion, timed on the client."""

    sent: float                      # perf_counter when the request was sent
    first: float | None = None       # first text-carrying chunk (rule 3)
    last: float | None = None        # last text-carrying chunk
    done: float = 0.0                # stream closed
    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    disk_cached_tokens: int | None = None  # frink-mlx usage extension (the SSD tier)
    draft_tokens: int | None = None    # frink-mlx usage extension (speculative decoding)
    draft_accepted: int | None = None
    finish_reason: str | None = None
    error: str | None = None         # an error event inside a 200 stream, or a dropped connection
    stamps: list[float] = field(default_factory=list)  # one per text chunk

    @property
    def ttft_s(self) -> float:
        if self.first is None:
            raise RuntimeError("no text arrived")
        return self.first - self.sent


def chat_body(server: Server, messages: list[dict[str, Any]], max_tokens: int,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                            "stream": True, "stream_options": {"include_usage": True}}
    if server.model is not None:
        body["model"] = server.model
    body.update(extra or {})
    return body


async def stream_chat(client: httpx.AsyncClient, server: Server, body: dict[str, Any]) -> Reply:
    """POST a streaming chat completion and time it (rule 3)."""
    reply = Reply(sent=time.perf_counter())
    try:
        async with client.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{server.name}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                _take_chunk(reply, json.loads(line[6:]), time.perf_counter())
    except httpx.TransportError as exc:  # a server that drops connections under load: a failure, counted
        reply.error = f"{type(exc).__name__}: {exc}"[:200]
    reply.done = time.perf_counter()
    return reply


def _take_chunk(reply: Reply, chunk: dict[str, Any], now: float) -> None:
    if chunk.get("error"):
        reply.error = str(chunk["error"].get("message", chunk["error"]))[:200]
    usage = chunk.get("usage")
    if usage:
        reply.prompt_tokens = usage.get("prompt_tokens")
        reply.completion_tokens = usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details") or {}
        reply.cached_tokens = details.get("cached_tokens")
        reply.disk_cached_tokens = details.get("disk_cached_tokens")
        reply.draft_tokens = usage.get("draft_tokens")
        reply.draft_accepted = usage.get("draft_accepted")
    for choice in chunk.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if text:
            reply.first = reply.first or now
            reply.last = now
            reply.text += text
            reply.stamps.append(now)
        reply.finish_reason = choice.get("finish_reason") or reply.finish_reason


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank-with-interpolation percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize_collapsed(path: Path, top: int = 15) -> str:
    """Top frames of a py-spy `--format raw` (collapsed stacks) file, per thread.

    Recorded with --idle, so shares are of wall time. Self = samples whose innermost
    frame is that function; total = samples with the function anywhere on the
    stack. Thread roots come from --threads.
    """
    if not path.exists():
        return f"no profile written to {path}"
    by_thread: dict[str, dict[str, list[int]]] = {}
    samples: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        thread, count = frames[0], int(count_text)
        samples[thread] = samples.get(thread, 0) + count
        table = by_thread.setdefault(thread, {})
        for frame in set(frames[1:]):
            table.setdefault(frame, [0, 0])[1] += count
        table.setdefault(frames[-1], [0, 0])[0] += count
    out = []
    for thread, table in sorted(by_thread.items(), key=lambda kv: -samples[kv[0]]):
        n = samples[thread]
        out.append(f"-- {thread}: {n} samples")
        for frame, (self_n, total_n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
            out.append(f"   self {self_n / n:6.1%}  total {total_n / n:6.1%}  {frame}")
    return "\n".join(out)
