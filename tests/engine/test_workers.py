"""Engines borrow long-lived MLX threads (engine/workers.py): loading and freeing models
again and again leaves no OS threads behind."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from frink_mlx.backend import select_backend
from frink_mlx.engine import workers
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.registry import load_registry
from frink_mlx.serving.generation import build_generation
from frink_mlx.settings import Settings


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/self/task")
def test_generations_built_and_freed_leave_no_threads_behind(tmp_path: Path,
                                                            make_tiny_llama) -> None:
    path = make_tiny_llama(tmp_path / "a")
    (tmp_path / "models.toml").write_text(f'default = "a"\n[models.a]\nsource = "{path}"\n')
    settings = Settings.load(models_path=str(tmp_path / "models.toml"))
    backend = select_backend(settings.backend_config())
    spec = load_registry(settings).resolve("a")
    counts = []
    # the hub builds generations on reused executor threads; so does this test
    with concurrent.futures.ThreadPoolExecutor(1) as loader:
        for number in range(1, 7):
            generation = loader.submit(build_generation, spec, settings.hub_config(), number,
                                       DecodeGate(), backend).result()
            generation.engine.shutdown(1.0)
            del generation
            counts.append(os_threads())
    # before the pool: one engine thread's streams (2-3 OS threads) stayed per generation
    assert counts[-1] <= counts[1], counts


def test_a_job_that_raises_is_logged_and_its_thread_serves_the_next(
        caplog: pytest.LogCaptureFixture) -> None:
    def boom() -> None:
        raise RuntimeError("engine failed")

    with caplog.at_level(logging.ERROR, logger="frink_mlx.engine"):
        job = workers.start(boom, "test-boom")
        job.join(5)
    assert not job.is_alive()
    assert "test-boom" in caplog.text and "engine failed" in caplog.text
    before = workers.num_threads()
    ran: list[str] = []
    job = workers.start(lambda: ran.append(threading.current_thread().name), "test-next")
    job.join(5)
    assert ran == ["test-next"] and workers.num_threads() == before


def test_join_times_out_while_the_job_runs() -> None:
    release = threading.Event()
    job = workers.start(lambda: release.wait(10), "test-slow")
    started = time.monotonic()
    job.join(0.2)
    assert job.is_alive() and time.monotonic() - started < 2
    release.set()
    job.join(5)
    assert not job.is_alive()
