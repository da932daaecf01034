"""A hybrid model over two ranks (issue 29): qwen3_5's GatedDeltaNet layers on a group.

Two `frink-mlx serve --distributed` ranks on a loopback ring serve a tiny random
qwen3_5 (hybrid_support.py: linear-attention and attention layers alternating;
query, KV and linear heads all divide by 2), split both ways its model file allows
(backend/distributed.py rule 3): tensor (each rank holds half of every layer's
heads, and half of each GatedDeltaNet state) and pipeline (each rank two layers,
one of each kind, and those layers' states). Rank 0 plans every state slot and
snapshot; each follower keeps its own (engine/follower.py message 3). Greedy ids
must equal mlx-lm's single-process generation, for rows batched together, for
n=2, and on a second turn that restarts from a state snapshot (cached_tokens > 0).
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_distributed import Daemon, start

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from hybrid_support import checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def hybrid_path(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint("qwen3_5", tiny_llama_dir, tmp_path_factory.mktemp("q35") / "q")


@pytest.fixture(scope="module", params=["tensor", "pipeline"])
def group(request: pytest.FixtureRequest, hybrid_path: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("group")
    registry = tmp / "models.toml"
    registry.write_text(f'default = "h"\n[models.h]\nsource = "{hybrid_path}"\n')
    daemon = start(registry, 2, tmp, FRINK_MLX_PREFILL_CHUNK_TOKENS="16",
                   FRINK_MLX_IDLE_PREFILL_TOKENS="16", FRINK_MLX_MAX_BATCH="4",
                   FRINK_MLX_DISTRIBUTED_SPLIT=str(request.param))
    daemon.split = str(request.param)  # type: ignore[attr-defined]
    yield daemon
    daemon.stop()


@functools.cache
def _model(path: str) -> Any:
    import mlx_lm

    return mlx_lm.load(path)[0]


def reference(path: Path, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own greedy ids, one process, its own caches."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(prompt), _model(str(path)), max_tokens=n)]


def complete(url: str, prompt: list[int], n: int, **extra: Any) -> Any:
    r = httpx.post(url + "/completion", timeout=120, json={
        "model": "h", "prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
        "return_tokens": True, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def prompts(seed: int, *lengths: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 384) for _ in range(n)] for n in lengths]


def test_the_group_serves_the_hybrid_split_as_asked_with_state_slots(group: Daemon):
    entry = httpx.get(group.url + "/v1/models/h", timeout=10).json()
    assert entry["parallel"] == {"kind": group.split, "ranks": 2}  # type: ignore[attr-defined]
    kv = httpx.get(group.url + "/health", timeout=10).json()["kv"]
    assert kv["state_slots_total"] == 4 and kv["state_snapshots_total"] > 0


def test_greedy_ids_equal_mlx_lm_alone_batched_and_for_n_2(group: Daemon, hybrid_path: Path):
    rows = prompts(1, 37, 9, 21)  # 37: three 16-token chunks
    with ThreadPoolExecutor(3) as pool:  # rows of different lengths in the same steps
        got = list(pool.map(lambda p: complete(group.url, p, 12)["tokens"], rows))
    assert got == [reference(hybrid_path, p, 12) for p in rows]
    pair = complete(group.url, rows[1], 8, n_cmpl=2)  # the forked row takes its parent's state
    assert [c["tokens"] for c in pair] == [reference(hybrid_path, rows[1], 8)] * 2


def test_a_second_turn_restarts_from_a_state_snapshot_on_every_rank(group: Daemon,
                                                                    hybrid_path: Path):
    """kv/snapshots.py rule 1: the first turn leaves its tail snapshot; the next turn
    restores it on rank 0 and on the follower, which must agree to give mlx-lm's ids."""
    first = prompts(2, 30)[0]
    answer = complete(group.url, first, 10)["tokens"]
    assert answer == reference(hybrid_path, first, 10)
    turn = first + answer + prompts(3, 7)[0]
    second = complete(group.url, turn, 10)
    assert second["tokens_cached"] > 0
    assert second["tokens"] == reference(hybrid_path, turn, 10)
