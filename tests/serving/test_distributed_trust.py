"""Who may be a rank (backend/trust.py): the shared secret, strays on the ring's ports.

Real `frink-mlx serve --distributed` ranks on loopback, as in test_distributed.py,
with their stderr kept: every refusal must be one clear line, no traceback.
MLX's ring takes the first connection on each rank's address and checks
nobody (backend/trust.py), so a stray that takes a slot must end the
formation within a bound, and a stray that speaks MLX's ring protocol but not
the secret must never see a plan.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from daemon_support import write_registry
from test_distributed import ROOT, _env, _free_port, chat, group_secret


@dataclass
class Rank:
    proc: subprocess.Popen[str]
    err: Path

    def lines(self) -> list[str]:
        return [line for line in self.err.read_text().splitlines() if line.strip()]


def _hostfile(tmp: Path, ranks: int = 2) -> tuple[Path, list[int]]:
    ports = [_free_port() for _ in range(ranks)]
    hostfile = tmp / f"hosts-{ports[0]}.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
    return hostfile, ports


def _rank(reg: Path, hostfile: Path, rank: int, tmp: Path, **env: str) -> Rank:
    err = tmp / f"rank{rank}-{hostfile.stem}.err"
    cmd = [sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0", "--models", str(reg),
           "--distributed", str(hostfile), "--rank", str(rank)]
    with open(err, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                env=_env(**env), cwd=ROOT)
    return Rank(proc, err)


def _kill(*ranks: Rank) -> None:
    for r in ranks:
        if r.proc.poll() is None:
            r.proc.kill()
        r.proc.wait(30)


def _connect(port: int, within_s: float) -> socket.socket:
    """A stray TCP connection to `port`, as soon as something listens there."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1)
        except OSError:
            assert time.monotonic() < deadline, f"nothing listened on {port}"
            time.sleep(0.02)


def _no_traceback(*ranks: Rank) -> None:
    for r in ranks:
        assert not any("Traceback" in line for line in r.lines()), r.lines()


@pytest.fixture(scope="module")
def registry_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import make_tiny_llama

    tmp = tmp_path_factory.mktemp("trust")
    return write_registry(tmp, make_tiny_llama(tmp / "a", seed=0), make_tiny_llama(tmp / "b", seed=1))


def test_a_rank_with_the_wrong_secret_is_refused_with_one_line(registry_path, tmp_path):
    hostfile, _ = _hostfile(tmp_path)
    wrong = group_secret("wrong", "another secret, not the group's 9876")
    ranks = [_rank(registry_path, hostfile, 0, tmp_path),
             _rank(registry_path, hostfile, 1, tmp_path, FRINK_MLX_DISTRIBUTED_SECRET_FILE=wrong)]
    try:
        started = time.monotonic()
        codes = [r.proc.wait(60) for r in ranks]
        assert all(code != 0 for code in codes), codes
        assert ranks[0].proc.stdout.read() == ""          # no ready line: never served
        for r, other in zip(ranks, (1, 0)):
            refusals = [line for line in r.lines() if "did not prove the group secret" in line]
            assert len(refusals) == 1 and f"rank(s) [{other}]" in refusals[0], r.lines()
            assert [line for line in r.lines() if "error" in line.lower()] == refusals
        _no_traceback(*ranks)
        print(f"wrong secret refused in {time.monotonic() - started:.1f}s")
    finally:
        _kill(*ranks)


def test_a_secret_file_others_can_read_is_refused_before_the_rank_listens(registry_path,
                                                                          tmp_path):
    loose = tmp_path / "loose_secret"
    loose.write_text("a group secret for these tests 0123")
    loose.chmod(0o644)
    hostfile, ports = _hostfile(tmp_path)
    rank = _rank(registry_path, hostfile, 1, tmp_path, FRINK_MLX_DISTRIBUTED_SECRET_FILE=str(loose))
    try:
        assert rank.proc.wait(60) == 2
        assert rank.lines() == [f"frink-mlx: error: group secret {loose} has mode 0644; it must "
                                f"not be readable by group or others (run: chmod 600 {loose})"]
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", ports[1]), timeout=1).close()
    finally:
        _kill(rank)


def test_a_stray_that_takes_a_ring_slot_ends_the_formation_within_the_bound(registry_path,
                                                                            tmp_path):
    """The stray connects to rank 0's ring port first, so MLX's ring accepts it as rank
    0's left neighbour; rank 1 then finds that port closed. Both ranks must exit with one
    clear line within the join bound (MLX's own connect retries end it first), and the
    stray must receive no plan."""
    hostfile, ports = _hostfile(tmp_path)
    rank0 = _rank(registry_path, hostfile, 0, tmp_path, FRINK_MLX_DISTRIBUTED_JOIN_TIMEOUT_S="30")
    stray = _connect(ports[0], 60)
    rank1 = _rank(registry_path, hostfile, 1, tmp_path, FRINK_MLX_DISTRIBUTED_JOIN_TIMEOUT_S="30")
    try:
        started = time.monotonic()
        codes = [r.proc.wait(60) for r in (rank0, rank1)]
        took_s = time.monotonic() - started
        assert all(code != 0 for code in codes), codes
        assert took_s < 45, f"the formation took {took_s:.0f}s to fail"
        assert rank0.proc.stdout.read() == ""
        for r in (rank0, rank1):
            errors = [line for line in r.lines() if line.startswith("frink-mlx: error:")]
            assert len(errors) == 1, r.lines()
            assert "cannot join the distributed group" in errors[0] \
                or "did not form within" in errors[0], errors
        _no_traceback(rank0, rank1)
        stray.settimeout(1)
        try:
            got = stray.recv(65536)
        except OSError:
            got = b""
        assert got == b"", got   # nothing, not a plan
        print(f"a stray in rank 0's slot: the formation failed in {took_s:.1f}s")
    finally:
        stray.close()
        _kill(rank0, rank1)


_SILENT_RANK = """
import os, sys, time
os.environ["MLX_HOSTFILE"], os.environ["MLX_RANK"] = sys.argv[1], "1"
import mlx.core as mx
mx.distributed.init(strict=True, backend="ring")
print("joined", flush=True)
time.sleep(120)
"""


def test_a_stray_speaking_mlx_ring_without_the_secret_never_gets_a_plan(registry_path,
                                                                        tmp_path):
    """A process that forms MLX's ring as rank 1 but proves nothing: rank 0 is stuck in
    the proof's first collective (holding the GIL), so only the join watchdog can end it:
    one line, within distributed_join_timeout_s, no ready line."""
    hostfile, _ = _hostfile(tmp_path)
    rank0 = _rank(registry_path, hostfile, 0, tmp_path, FRINK_MLX_DISTRIBUTED_JOIN_TIMEOUT_S="10")
    intruder = subprocess.Popen([sys.executable, "-c", _SILENT_RANK, str(hostfile)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert intruder.stdout.readline().strip() == "joined"   # MLX's ring let it in
        joined = time.monotonic()
        code = rank0.proc.wait(30)
        assert code != 0 and time.monotonic() - joined < 15
        assert rank0.proc.stdout.read() == ""
        assert rank0.lines() == [
            "frink-mlx: error: rank 0: the distributed group did not form within 10s "
            "(distributed_join_timeout_s): a rank is missing or a stray connection took a "
            "ring slot; exiting"]
    finally:
        intruder.kill()
        intruder.wait(10)
        _kill(rank0)


def test_once_formed_the_ring_ports_refuse_strays_and_the_group_serves(registry_path, tmp_path):
    hostfile, ports = _hostfile(tmp_path)
    ranks = [_rank(registry_path, hostfile, r, tmp_path) for r in (0, 1)]
    try:
        ready = json.loads(ranks[0].proc.stdout.readline())
        for port in ports:   # MLX's ring closed its listeners once it accepted its peers
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
        assert httpx.get(ready["url"] + "/health", timeout=10).json()["ranks"] == 2
        assert chat(ready["url"], "still one group", max_tokens=4)["choices"]
        _no_traceback(*ranks)
    finally:
        _kill(*ranks)


def test_join_deadline_kills_a_blocked_process_with_one_line_and_spares_one_that_ends():
    code = ("import time\nfrom frink_mlx.backend.trust import join_deadline\n"
            "with join_deadline(5, 0):\n    time.sleep(0.1)\nprint('ok', flush=True)\n"
            "with join_deadline(0.5, 3):\n    time.sleep(30)\nprint('not reached')\n")
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout == "ok\n" and out.returncode == -9 and time.monotonic() - started < 20
    assert out.stderr.splitlines() == [
        "frink-mlx: error: rank 3: the distributed group did not form within 0.5s "
        "(distributed_join_timeout_s): a rank is missing or a stray connection took a ring "
        "slot; exiting"]
