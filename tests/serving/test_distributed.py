"""One model over two ranks (serving/distributed.py, engine/channel.py, engine/follower.py).

Two `frink-mlx serve --distributed HOSTFILE --rank R` processes joined by MLX's
ring backend over loopback (free ports), against one single-process daemon
serving the same tiny random checkpoint, split both ways (backend/distributed.py
rule 3): tensor parallel (llama, heads 4, KV heads 2: both divide by 2) and
pipeline (qwen2 of three layers: rank 0 runs the last two, rank 1 the first).
Greedy decoding must give the same tokens; aborts, swaps, structured
output and the prefix cache must work unchanged from the client's side; a
killed follower must turn into 503s within a bounded time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemon_support import write_registry

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = ("You are a careful assistant. Answer briefly, cite nothing, and keep every answer "
          "to the point. " * 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_secret(name: str = "shared", text: str = "a group secret for these tests 0123") -> str:
    """A secret file (mode 0600) for this test session (backend/trust.py rule 1)."""
    path = Path(tempfile.gettempdir()) / f"frink-test-secret-{os.getpid()}-{name}"
    if not path.exists():
        path.write_text(text)
        path.chmod(0o600)
    return str(path)


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FRINK_MLX_LOG_LEVEL": "warning",
            "FRINK_MLX_DISTRIBUTED_SECRET_FILE": group_secret(),
            "FRINK_MLX_DISTRIBUTED_PING_S": "0.5", "FRINK_MLX_DISTRIBUTED_TIMEOUT_S": "20",
            "FRINK_MLX_DISTRIBUTED_EXIT_AFTER_LOST_S": "3600",
            **extra}


@dataclass
class Daemon:
    procs: list[subprocess.Popen[str]]
    url: str

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def _serve(reg: Path, ranks: int, tmp: Path, **env: str) -> subprocess.Popen[str] | Daemon:
    cmd = [sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0", "--models", str(reg)]
    if ranks == 1:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=_env(**env), cwd=ROOT)]
    else:
        hostfile = tmp / f"hosts-{_free_port()}.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{_free_port()}"] for _ in range(ranks)]))
        procs = [subprocess.Popen([*cmd, "--distributed", str(hostfile), "--rank", str(rank)],
                                  stdout=subprocess.PIPE, text=True, env=_env(**env), cwd=ROOT)
                 for rank in range(ranks)]
    line = procs[0].stdout.readline()  # type: ignore[union-attr]
    if not line:
        for proc in procs:
            proc.kill()
        return procs[0]
    return Daemon(procs, json.loads(line)["url"])


def start(reg: Path, ranks: int, tmp: Path, **env: str) -> Daemon:
    daemon = _serve(reg, ranks, tmp, **env)
    assert isinstance(daemon, Daemon), "the daemon did not print its ready line"
    return daemon


@pytest.fixture(scope="module")
def registry_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import make_tiny_llama

    tmp = tmp_path_factory.mktemp("dist")
    return write_registry(tmp, make_tiny_llama(tmp / "a", seed=0), make_tiny_llama(tmp / "b", seed=1))


@pytest.fixture(scope="module", params=["tensor", "pipeline"])
def split(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def pair(split: str, registry_path: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Daemon]]:
    """(single-process reference, two-rank group split `split`-wise) serving the same
    registry, with 16-token prefill chunks so that every prompt here is prefilled in
    several steps."""
    tmp = tmp_path_factory.mktemp("group")
    if split == "pipeline":
        from conftest import make_tiny_qwen2

        registry_path = write_registry(tmp, make_tiny_qwen2(tmp / "a", num_hidden_layers=3),
                                       make_tiny_qwen2(tmp / "b", seed=1))
    chunks = {"FRINK_MLX_PREFILL_CHUNK_TOKENS": "16", "FRINK_MLX_IDLE_PREFILL_TOKENS": "16",
              "FRINK_MLX_DISTRIBUTED_SPLIT": split}
    single = start(registry_path, 1, tmp, **chunks)
    try:
        group = start(registry_path, 2, tmp, **chunks)
    except BaseException:
        single.stop()
        raise
    yield single, group
    group.stop()
    single.stop()


def chat(url: str, content: str, *, max_tokens: int = 24, model: str = "tiny-a",
         **extra: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "logprobs": True,
            "ignore_eos": True, "messages": [{"role": "system", "content": SYSTEM},
                                             {"role": "user", "content": content}], **extra}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def tokens(answer: dict[str, Any]) -> list[str]:
    return [t["token"] for t in answer["choices"][0]["logprobs"]["content"]]


def test_models_says_how_the_model_is_split_over_two_ranks(pair, split):
    _, group = pair
    entry = httpx.get(group.url + "/v1/models/tiny-a", timeout=10).json()
    assert entry["parallel"] == {"kind": split, "ranks": 2}
    health = httpx.get(group.url + "/health", timeout=10).json()
    assert health["state"] == "ready" and health["ranks"] == 2


def test_greedy_tokens_equal_the_single_process_daemon(pair):
    single, group = pair
    want, got = chat(single.url, "Hello there"), chat(group.url, "Hello there")
    assert tokens(got) == tokens(want) and len(tokens(got)) == 24
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    # n=2 forks rows that share the prompt's blocks (block copies travel in the plan)
    want2, got2 = chat(single.url, "Fork me", n=2), chat(group.url, "Fork me", n=2)
    assert [c["message"] for c in got2["choices"]] == [c["message"] for c in want2["choices"]]


def test_four_concurrent_requests_of_different_lengths_hit_the_prefix_cache(pair):
    single, group = pair
    prompts = [("a short one", 8), ("a somewhat longer question about rivers", 30),
               ("tell me about " + "mountains and valleys " * 6, 17), ("x", 41)]
    for daemon in (single, group):  # the shared system prompt is cached on both
        chat(daemon.url, "warm the cache", max_tokens=2)
    answers = {}
    for url in (single.url, group.url):
        with ThreadPoolExecutor(4) as pool:
            answers[url] = list(pool.map(
                lambda p, url=url: chat(url, p[0], max_tokens=p[1]), prompts))
    for want, got, (_, n) in zip(answers[single.url], answers[group.url], prompts):
        assert tokens(got) == tokens(want) and len(tokens(got)) == n
        assert got["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_structured_output_and_a_swap_across_ranks(pair):
    single, group = pair
    fmt = {"response_format": {"type": "json_object"}}
    want, got = chat(single.url, "a json object", max_tokens=16, **fmt), \
        chat(group.url, "a json object", max_tokens=16, **fmt)
    assert tokens(got) == tokens(want)
    want_b = chat(single.url, "swap to b", model="tiny-b")
    got_b = chat(group.url, "swap to b", model="tiny-b")  # every rank loads b, or none does
    assert tokens(got_b) == tokens(want_b)
    assert httpx.get(group.url + "/health", timeout=10).json()["model"] == "tiny-b"
    assert tokens(chat(group.url, "back to a")) == tokens(chat(single.url, "back to a"))


def test_abort_mid_stream_frees_the_blocks_and_the_ranks_stay_in_step(pair):
    single, group = pair
    body = {"model": "tiny-a", "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
            "stream": True, "messages": [{"role": "user", "content": "stream a long answer"}]}
    with httpx.stream("POST", group.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 20:
                break
    deadline = time.monotonic() + 20
    while True:
        kv = httpx.get(group.url + "/health", timeout=10).json()["kv"]
        if kv["blocks_used"] == 0:
            break
        assert time.monotonic() < deadline, kv
        time.sleep(0.1)
    # Rank 1's pool is addressed by rank 0's block ids: reusing the freed blocks
    # (and the prefix cached in them) must still give the single daemon's tokens.
    assert tokens(chat(group.url, "after the abort")) == tokens(chat(single.url, "after the abort"))


def test_a_model_too_large_for_one_rank_budget_is_served_by_two(registry_path, tmp_path):
    budget = {"FRINK_MLX_KV_BUDGET_BYTES": "400000"}  # weights ~426 kB whole, ~262 kB per rank
    alone = _serve(registry_path, 1, tmp_path, **budget)
    assert not isinstance(alone, Daemon), "one rank should not fit the model"
    assert alone.wait(60) != 0
    group = start(registry_path, 2, tmp_path, **budget)
    try:
        health = httpx.get(group.url + "/health", timeout=10).json()
        assert health["state"] == "ready" and 0 < health["context_ceiling"] < 2048
        assert len(tokens(chat(group.url, "fits on two", max_tokens=8))) == 8
    finally:
        group.stop()


def test_a_killed_follower_gives_503_within_a_bounded_time(registry_path, tmp_path):
    group = start(registry_path, 2, tmp_path)
    try:
        assert chat(group.url, "before")["choices"]
        group.procs[1].kill()
        killed = time.monotonic()
        while httpx.get(group.url + "/health", timeout=10).status_code != 503:
            assert time.monotonic() - killed < 10, "no 503 within 10 s"
            time.sleep(0.1)
        health = httpx.get(group.url + "/health", timeout=10).json()
        assert health["state"] == "unavailable" and "lost" in health["reason"]
        r = httpx.post(group.url + "/v1/chat/completions", timeout=10, json={
            "model": "tiny-a", "messages": [{"role": "user", "content": "after"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        assert r.headers["retry-after"]
        r = httpx.post(group.url + "/v1/messages", timeout=10, json={
            "model": "tiny-a", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 503 and r.json()["type"] == "error"
    finally:
        group.stop()


def test_a_follower_that_stops_answering_fails_the_stream_in_flight_and_gives_503(
        registry_path, tmp_path):
    """SIGSTOP: the follower keeps its sockets open, so only the watchdog can tell."""
    group = start(registry_path, 2, tmp_path, FRINK_MLX_DISTRIBUTED_TIMEOUT_S="3")
    try:
        body = {"model": "tiny-a", "max_tokens": 1500, "temperature": 0, "ignore_eos": True,
                "stream": True, "messages": [{"role": "user", "content": "a long answer"}]}
        lines: list[str] = []
        with httpx.stream("POST", group.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                lines.append(line)
                if len(lines) == 10:
                    os.kill(group.procs[1].pid, signal.SIGSTOP)
                    stopped = time.monotonic()
        ended_s = time.monotonic() - stopped
        assert ended_s < 15, f"the stream took {ended_s:.1f}s to end"
        assert any('"error"' in line for line in lines[10:]), lines[-3:]
        health = httpx.get(group.url + "/health", timeout=10)
        assert health.status_code == 503 and "stopped answering" in health.json()["reason"]
        r = httpx.post(group.url + "/v1/chat/completions", timeout=10, json={
            "model": "tiny-a", "messages": [{"role": "user", "content": "after"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
    finally:
        os.kill(group.procs[1].pid, signal.SIGCONT)
        group.stop()


def test_rank_0_of_a_lost_group_exits_1_so_the_supervisor_restarts_it(registry_path, tmp_path):
    group = start(registry_path, 2, tmp_path, FRINK_MLX_DISTRIBUTED_EXIT_AFTER_LOST_S="1")
    try:
        group.procs[1].kill()
        assert group.procs[0].wait(30) == 1
    finally:
        group.stop()


def test_sigterm_on_rank_0_stops_the_whole_group_cleanly(registry_path, tmp_path):
    group = start(registry_path, 2, tmp_path)
    try:
        group.procs[0].send_signal(signal.SIGTERM)
        assert group.procs[0].wait(60) == 0
        assert group.procs[1].wait(30) == 0  # the follower got Stop
    finally:
        group.stop()


def _launcher_ports() -> int:
    """A first port for `mlx.launch -p P`: the ring listens on P and P+1 (one per rank)."""
    for _ in range(50):
        port = _free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports in a row")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True,
                         check=True).stdout
    return [int(p) for p, pp in (line.split() for line in out.splitlines()) if int(pp) == pid]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                           text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")  # an orphan nobody reaped yet is gone


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    import selectors

    assert proc.stdout is not None
    line, deadline = b"", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise AssertionError(f"no ready line from mlx.launch within {timeout_s:.0f} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"mlx.launch ended (rc {proc.wait(5)}) without a ready line")
            line += chunk
    return line.split(b"\n", 1)[0]


def test_a_group_started_by_mlx_launch_serves_and_ends_with_the_launcher(registry_path, tmp_path):
    """README's `mlx.launch --backend ring ... -- frink-mlx serve` (ranks read MLX_RANK and
    MLX_HOSTFILE), here with `-n 2`: both ranks on loopback. SIGTERM to the launcher must
    end both ranks (cli/serve.py rule 8), which it does not stop by itself."""
    launcher_bin = Path(sys.executable).with_name("mlx.launch")
    if not launcher_bin.exists():
        pytest.skip("no mlx.launch beside this interpreter")
    single = start(registry_path, 1, tmp_path)
    ranks: list[int] = []
    launcher = None
    try:
        want = chat(single.url, "Hello there")
        with open(tmp_path / "launch.err", "wb") as err:
            launcher = subprocess.Popen(
                [str(launcher_bin), "--backend", "ring", "-n", "2", "-p", str(_launcher_ports()),
                 "--", sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0",
                 "--models", str(registry_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=ROOT)
        ready = json.loads(_read_line(launcher, 60))
        ranks = _children(launcher.pid)
        assert ready["pid"] in ranks and len(ranks) == 2, (ready, ranks)
        url = ready["url"]
        health = httpx.get(url + "/health", timeout=10).json()
        assert health["state"] == "ready" and health["ranks"] == 2
        entry = httpx.get(url + "/v1/models/tiny-a", timeout=10).json()
        assert entry["parallel"] == {"kind": "tensor", "ranks": 2}
        got = chat(url, "Hello there")
        assert tokens(got) == tokens(want) and len(tokens(got)) == 24
        assert got["choices"][0]["message"] == want["choices"][0]["message"]

        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(10) == -signal.SIGTERM
        deadline = time.monotonic() + 20
        while any(_alive(pid) for pid in ranks):
            assert time.monotonic() < deadline, \
                f"ranks {[p for p in ranks if _alive(p)]} outlived mlx.launch by 20 s"
            time.sleep(0.1)
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.wait(10)
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        single.stop()
