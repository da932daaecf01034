"""Test-only helpers for the daemon tests: registries of tiny checkpoints,
a uvicorn server on a free port in a thread, `frink-mlx serve` as a real
process (`DaemonProcess`), and a stand-in engine.

`ThreadEngine` is a deliberately simple, test-only implementation of the
Engine API (submit -> SeqStream of StepOutputs, abort, stats, shutdown) built
on `mlx_lm.generate_step`, so the HTTP layer could be exercised before the real
engine landed. Daemon tests run through the real `frink_mlx.engine.engine.Engine`
whenever it is importable; `ThreadEngine` is only the fallback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx

from frink_mlx.engine.types import EngineStats, SeqRequest, StepOutput

MODELS_TOML = """\
default = "tiny-a"

[models.tiny-a]
source = "{a}"
aliases = ["alpha", "gpt-4o-mini"]

[models.tiny-b]
source = "{b}"
aliases = ["beta"]
{extra}
"""


def write_registry(tmp: Path, a: Path, b: Path, extra: str = "") -> Path:
    path = tmp / "models.toml"
    path.write_text(MODELS_TOML.format(a=a, b=b, extra=extra))
    return path


def real_engine_available() -> bool:
    try:
        import frink_mlx.engine.engine  # noqa: F401
        import frink_mlx.models.budget  # noqa: F401
    except ImportError:
        return False
    return True


class _Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.queue: asyncio.Queue[StepOutput | None] = asyncio.Queue()
        self.loop = loop
        self.aborted = threading.Event()

    def put(self, item: StepOutput | None) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def abort(self, index: int | None = None) -> None:
        if index is None:  # one row's abort (a stop string): its tokens are just dropped
            self.aborted.set()

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> StepOutput:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


class ThreadEngine:
    """Test-only Engine stand-in: one thread per request, rows one after another."""

    def __init__(self, loaded: Any, config: Any = None, gate: Any = None) -> None:
        self.loaded = loaded
        self.gate = gate or threading.Lock()
        self.steps = 0
        self.running = 0
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        pass

    def submit(self, seq: SeqRequest) -> _Stream:
        stream = _Stream(asyncio.get_running_loop())
        t = threading.Thread(target=self._run, args=(seq, stream), daemon=True)
        self.threads.append(t)
        t.start()
        return stream

    def _run(self, seq: SeqRequest, stream: _Stream) -> None:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_logits_processors, make_sampler

        self.running += 1
        try:
            for row in range(seq.n):
                s = seq.sampling
                if s.seed is not None:
                    mx.random.seed(s.seed + row)
                sampler = make_sampler(s.temperature, s.top_p, s.min_p, top_k=s.top_k)
                procs = make_logits_processors(s.logit_bias, s.repetition_penalty
                                               if s.repetition_penalty != 1.0 else None)
                first, count = True, 0
                with self.gate:
                    gen = generate_step(mx.array(seq.prompt_ids), self.loaded.model,
                                        max_tokens=seq.max_tokens, sampler=sampler,
                                        logits_processors=procs)
                    for tok, logprobs in gen:
                        if stream.aborted.is_set():
                            stream.put(StepOutput(row, None, finish="abort"))
                            break
                        self.steps += 1
                        count += 1
                        tok = int(tok)
                        finish = "eos" if tok in seq.stop_token_ids else \
                            ("length" if count >= seq.max_tokens else None)
                        stream.put(StepOutput(
                            row, tok, logprob=float(logprobs[tok]), finish=finish,
                            num_prompt_tokens=len(seq.prompt_ids) if first else None,
                            num_cached_tokens=0 if first else None))
                        first = False
                        if finish:
                            break
                if stream.aborted.is_set():
                    break
        finally:
            self.running -= 1
            stream.put(None)

    def stats(self) -> EngineStats:
        return EngineStats(num_running=self.running, steps_total=self.steps,
                           context_ceiling=self.loaded.context_length)

    def shutdown(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)


def thread_engine_factory(spec: Any, settings: Any, number: int, gate: Any, backend: Any) -> Any:
    """A Generation factory: the real loader, ThreadEngine (test-only fallback)."""
    from frink_mlx.models.loader import load_model
    from frink_mlx.serving.generation import Generation

    loaded = load_model(spec, settings.load, backend)
    return Generation(number, spec, loaded, ThreadEngine(loaded, None, gate), None, time.monotonic())


def generation_factory() -> Any:
    if real_engine_available():
        from frink_mlx.serving.generation import build_generation

        return build_generation
    return thread_engine_factory


@dataclass
class LiveServer:
    url: str
    server: Any
    thread: threading.Thread
    app: Any

    @property
    def state(self) -> Any:
        return self.app.state.frink

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def start_server(app: Any) -> LiveServer:
    import uvicorn

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    return LiveServer(f"http://127.0.0.1:{port}", server, thread, app)


def start_guarded_server(app: Any, settings: Any, *, sndbuf: int | None = None) -> LiveServer:
    """`app` served as `frink-mlx serve` serves it (cli/serve.py `uvicorn_config`: the h11
    protocol with every timer of http/timeouts.py), in a thread, on a loopback socket
    bound here. `sndbuf` shrinks the send buffer every accepted connection inherits,
    so a client that stops reading stalls the server within a few frames."""
    import socket

    import uvicorn

    from frink_mlx.cli.serve import bind_socket, uvicorn_config

    sock = bind_socket("127.0.0.1", 0, getattr(settings, "send_buffer_bytes", None))
    if sndbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    server = uvicorn.Server(uvicorn_config(settings, app))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return LiveServer(f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread, app)


def first_line_of_a_new_connection(url: str) -> bytes:
    """The status line a new connection gets for `GET /health` with a foreign Host:
    503 at the connection cap (before a byte of it is read), else 421; closed after."""
    import socket
    from urllib.parse import urlparse

    address = urlparse(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0]


def fill_the_cap(url: str, cap: int) -> list[Any]:
    """Idle connections opened until a new one is refused (503): the daemon is at its
    connection cap while the caller holds them (at most `cap`; the caller closes them)."""
    import socket
    from urllib.parse import urlparse

    address = urlparse(url)
    held: list[socket.socket] = []
    try:
        while not first_line_of_a_new_connection(url).startswith(b"HTTP/1.1 503"):
            if len(held) >= cap:
                raise AssertionError(f"{cap} connections held and still no refusal")
            held.append(socket.create_connection((address.hostname, address.port), timeout=10))
    except BaseException:
        for sock in held:
            sock.close()
        raise
    return held


def flood_at_the_cap(url: str, cap: int, rounds: int,
                     refusals: Callable[[httpx.Client, int], None],
                     timeout: float = 10) -> list[bytes]:
    """Strangers refused while the daemon is at its connection cap: a client's connection
    goes in first, the cap is filled with idle ones (`fill_the_cap`), then each of `rounds`
    runs `refusals(client, k)` on that connection and opens one new connection, whose
    status line is returned (503 at the cap); the idle ones are closed at the end."""
    heads: list[bytes] = []
    with httpx.Client(base_url=url, timeout=timeout) as client:
        client.get("/health")   # its connection is in before the cap fills
        held = fill_the_cap(url, cap)
        try:
            for k in range(rounds):
                refusals(client, k)
                heads.append(first_line_of_a_new_connection(url))
        finally:
            for sock in held:
                sock.close()
    return heads


ROOT = Path(__file__).resolve().parents[1]


def daemon_env(**settings: object) -> dict[str, str]:
    """The environment of a `frink-mlx serve` child: this checkout importable, settings as
    FRINK_MLX_* variables (None = unset)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name, value in settings.items():
        key = "FRINK_MLX_" + name.upper()
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


class DaemonProcess:
    """`python -m frink_mlx.cli serve --port 0 ...` as a child process.

    stdout is the ready line; stderr (the log) goes to a file so a chatty
    daemon can never block on a full pipe. `ready()` waits for the line. The prefix
    cache's SSD tier writes under `tmp` unless the test says where (never into the
    user's cache, where a later run would find this one's blocks)."""

    def __init__(self, tmp: Path, *args: str, **settings: object) -> None:
        self.log_path = tmp / f"daemon-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("w")
        kv_disk = {} if "cache_dir" in settings else {"kv_disk_dir": str(tmp / "kv-disk")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=ROOT,
            env=daemon_env(**{"log_level": "info", **kv_disk, **settings}))
        self.url = ""
        self.ready_line: dict[str, Any] = {}

    def ready(self, timeout_s: float = 180.0) -> dict[str, Any]:
        line = self._readline(timeout_s)
        if not line:
            raise RuntimeError(f"daemon exited {self.proc.poll()}: {self.log()[-3000:]}")
        self.ready_line = json.loads(line)
        self.url = self.ready_line["url"]
        return self.ready_line

    def _readline(self, timeout_s: float) -> str:
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout_s)
        if reader.is_alive():
            raise TimeoutError(f"no ready line in {timeout_s} s: {self.log()[-3000:]}")
        return out[0]

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def log_lines_at(self, level: str) -> list[str]:
        return [line for line in self.log().splitlines() if f" {level} " in line]

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._log.close()
