"""The hybrid and mixed-attention families across swaps, through one daemon (issue 29).

One daemon (real HTTP, a free port) serves tiny random checkpoints of the ten families of
tests/engine/hybrid_support.py, `other` (a second entry on the largest one's files), and
three that cannot load. For each family, greedy token ids through llama.cpp's /completion
(token-id prompts longer than the sliding windows, `ignore_eos`) equal mlx-lm's
`generate_step` with the EOS ids banned:

1. on generation 1;
2. across a hot swap: a stream in flight on generation 1 while the model is unloaded by
   name and the next request loads generation 2 (hub rules 4-5): the stream finishes on
   generation 1 with mlx-lm's ids, generation 2 answers with them;
3. across a residency eviction: the budget holds one model, so loading `other` evicts
   the family's idle generation (hub rule 9), and the next request loads generation 3.

Each retired generation is freed (nothing retired, releasing or lingering in
/admin/models, so its state slots, snapshots and window blocks went with it) and its
engine's last stats, read as the hub frees it, hold no slot, block or window block;
/health of the generation serving afterwards holds none once its requests end.

Bad input (issue 29's last point): a checkpoint missing a tensor, a config with an
unknown layer type and a GGUF of an unmapped architecture are each refused at load in
one line naming it, and the daemon keeps serving the families.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from daemon_support import generation_factory, start_guarded_server

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from hybrid_support import RECURRENT, WINDOWED, prompts, write  # noqa: E402

FAMILIES = RECURRENT + WINDOWED
PROMPT = prompts(29, (20,))[0]  # longer than every window (6)
NUM_TOKENS, NUM_STREAM_TOKENS = 6, 64
POOL_BYTES = 256 * 1024
BAD = ("missing-tensor", "unknown-layers", "unmapped-gguf")


class Live:
    def __init__(self, server: Any, paths: dict[str, Path]) -> None:
        self.server, self.url, self.paths = server, server.url, paths
        self.final: dict[int, Any] = {}  # generation number -> its engine's last stats
        self.refs: dict[tuple[str, int], list[int]] = {}

    @property
    def hub(self) -> Any:
        return self.server.state.hub

    def reference(self, family: str, n: int) -> list[int]:
        """mlx-lm's own greedy ids on the checkpoint the daemon serves, its EOS ids banned
        as llama.cpp's `ignore_eos` bans them (adapters/llamacpp rule 7)."""
        if (family, n) not in self.refs:
            import mlx.core as mx
            import mlx_lm
            from mlx_lm.generate import generate_step

            model, tokenizer = mlx_lm.load(str(self.paths[family]))
            eos = sorted(tokenizer.eos_token_ids)

            def ban(_tokens: mx.array, logits: mx.array) -> mx.array:
                logits[:, eos] = -mx.inf
                return logits

            self.refs[family, n] = [int(t) for t, _ in generate_step(
                mx.array(PROMPT), model, max_tokens=n, logits_processors=[ban])]
        return self.refs[family, n]


def body(model: str, n: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": PROMPT, "n_predict": n, "temperature": 0,
            "ignore_eos": True, "return_tokens": True, "cache_prompt": True, **extra}


def complete(live: Live, model: str, n: int = NUM_TOKENS) -> list[int]:
    r = httpx.post(live.url + "/completion", json=body(model, n), timeout=300)
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def generation_of(live: Live, model: str) -> int:
    numbers = [g.number for g in live.hub.resident if g.spec.name == model]
    assert len(numbers) == 1, numbers
    return int(numbers[0])


def wait_freed(live: Live, number: int, family: str) -> None:
    """Until the hub's free of generation `number` is done and its memory is back."""
    deadline = time.monotonic() + 120
    while True:
        info = httpx.get(live.url + "/admin/models", timeout=10).json()
        retired = [g["generation"] for g in info["retired"]]
        if number in live.final and number not in retired and not info["releasing"]:
            break
        assert time.monotonic() < deadline, f"generation {number} never freed: {info}"
        time.sleep(0.05)
    assert info["lingering"] == []
    stats = live.final[number]
    assert (stats.num_running, stats.num_blocks_used) == (0, 0)
    if family in RECURRENT:
        assert stats.state_slots_total > 0 and stats.state_slots_used == 0
    else:
        assert stats.window_blocks_total > 0 and stats.window_blocks_used == 0


def check_health_idle(live: Live, family: str) -> None:
    health = httpx.get(live.url + "/health", timeout=10).json()
    assert health["model"] == family and health["running"] == 0
    kv = health["kv"]
    assert kv["blocks_used"] == 0
    if family in RECURRENT:
        assert kv["state_slots_total"] > 0 and kv["state_slots_used"] == 0
        assert 0 <= kv["state_snapshots_used"] <= kv["state_snapshots_total"]
    else:
        sliding = kv["kinds"]["sliding"]
        assert sliding["window"] >= 6 and sliding["blocks_used"] == 0


def bad_checkpoints(root: Path, good: Path, llama: Path, vocab: int) -> dict[str, Path]:
    """Issue 29's bad input: a tensor missing, an unknown layer type, an unmapped GGUF."""
    import mlx.core as mx

    missing = root / "missing-tensor"
    shutil.copytree(good, missing)
    weights = mx.load(str(missing / "model.safetensors"))
    gone = sorted(k for k in weights if k.endswith("o_proj.weight"))[0]
    mx.save_safetensors(str(missing / "model.safetensors"),
                        {k: v for k, v in weights.items() if k != gone})
    layers = write("lfm2", root / "unknown-layers", vocab_size=vocab)
    config = json.loads((layers / "config.json").read_text())
    config["layer_types"] = ["conv", "full_attention", "mystery_mixer", "full_attention"]
    (layers / "config.json").write_text(json.dumps(config))
    return {"missing-tensor": missing, "unknown-layers": layers,
            "unmapped-gguf": unmapped_gguf(root / "mamba2.gguf", llama)}


def unmapped_gguf(path: Path, llama: Path) -> Path:
    """A GGUF of llama.cpp's `mamba2` architecture, which has no mlx-lm mapping here."""
    import gguf
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from gguf_helpers import close_writer, gguf_metadata, write_metadata

    writer = gguf.GGUFWriter(str(path), arch="mamba2")
    writer.add_block_count(1)
    write_metadata(writer, {k: v for k, v in gguf_metadata(llama).items()
                            if k.startswith("tokenizer.")})
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    close_writer(writer)
    return path


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Live]:
    from frink_mlx.serving import release

    root = tmp_path_factory.mktemp("hybrid-swaps")
    vocab = json.loads((tiny_llama_dir / "config.json").read_text())["vocab_size"]
    paths: dict[str, Path] = {}
    for family in FAMILIES:
        paths[family] = write(family, root / family, vocab_size=vocab)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny_llama_dir / name, paths[family] / name)
    sizes = {f: (p / "model.safetensors").stat().st_size for f, p in paths.items()}
    paths["other"] = paths[max(sizes, key=sizes.__getitem__)]
    paths.update(bad_checkpoints(root, paths["qwen3_5"], tiny_llama_dir, vocab))
    # One fits: the largest model's estimate (weights x 1.1) and a pool capped at
    # POOL_BYTES; any resident model (weights + its pool) leaves less than that free.
    budget = int(1.1 * max(sizes.values())) + POOL_BYTES
    registry = root / "models.toml"
    registry.write_text(f'default = "{FAMILIES[0]}"\n' + "".join(
        f'[models.{name}]\nsource = "{path}"\n' for name, path in paths.items()))
    settings = Settings.load(models_path=str(registry), access_log=False, min_generation_s=0.0,
                             cache_dir=str(root / "cache"), kv_budget_bytes=budget,
                             memory_headroom_fraction=0.0, max_kv_pool_bytes=POOL_BYTES,
                             evict_wait_s=5.0, max_batch=4)
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    state = Live(start_guarded_server(app, settings, sndbuf=4096), paths)
    real = release.free_generation

    def recording(gen: Any, timeout_s: float) -> None:  # the engine's stats once it stopped
        real(gen, timeout_s)
        if gen.engine is not None:
            state.final[gen.number] = gen.engine.stats()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(release, "free_generation", recording)
        yield state
    state.server.stop()


class HeldStream:
    """A /completion stream read through a 2 KiB receive buffer (the server's send buffer
    is 4 KiB): once the reader stops, the server cannot finish the response, so the
    request keeps its lease on its generation until `finish` reads the rest.

    What the server can write before it blocks is the two kernel buffers (Linux doubles
    each: about 12 KiB) plus asyncio's transport buffer, which uvicorn fills to its 64 KiB
    high-water mark before it pauses: about 77 KiB. The response must be well over that,
    or the hold is only a race with decode. With 20 candidates per token (the most
    `n_probs` takes) 64 tokens come to about 105 KiB (with 8, about 50 KiB: measured, the
    test then failed whenever decode outran the unload)."""

    def __init__(self, live: Live, model: str, n: int) -> None:
        host, port = live.url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
        self.sock.settimeout(300)
        self.sock.connect((host, int(port)))
        # n_probs: 20 candidates per token (about 1.6 KiB), so 64 tokens are more than the
        # buffers hold (the docstring); greedy ids are unchanged by it
        payload = json.dumps(body(model, n, stream=True, n_probs=20)).encode()
        self.sock.sendall(b"POST /completion HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n"
                          b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                          % (host.encode(), port.encode(), len(payload)) + payload)
        self.raw = b""
        while b"data: {" not in self.raw:  # the first frame: the row is running
            self.raw += self._recv()

    def _recv(self) -> bytes:
        data = self.sock.recv(1024)
        if not data:
            raise EOFError
        return data

    def finish(self) -> list[int]:
        """Read to the end; the ids of every frame."""
        with contextlib.suppress(EOFError):
            while True:
                self.raw += self._recv()
        self.sock.close()
        head, _, chunked = self.raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        text, rest = b"", chunked
        while rest:  # chunked transfer encoding
            size, _, rest = rest.partition(b"\r\n")
            text, rest = text + rest[:int(size, 16)], rest[int(size, 16) + 2:]
        return [i for line in text.decode().splitlines() if line.startswith("data: {")
                for i in json.loads(line[6:]).get("tokens") or []]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_ids_across_a_hot_swap_and_an_eviction(live: Live, family: str) -> None:
    want, want_long = live.reference(family, NUM_TOKENS), live.reference(family, NUM_STREAM_TOKENS)
    assert complete(live, family) == want  # generation 1
    first = generation_of(live, family)
    held = HeldStream(live, family, NUM_STREAM_TOKENS)
    r = httpx.post(live.url + "/admin/models/unload", json={"model": family}, timeout=60)
    assert r.status_code == 200 and r.json()["generation"] == first
    assert first in [g.number for g in live.hub.retired]  # leased by the stream
    assert complete(live, family) == want  # the hot swap: generation 2, gen 1 still streaming
    second = generation_of(live, family)
    assert second > first and first in [g.number for g in live.hub.retired]
    assert held.finish() == want_long  # finished on generation 1
    wait_freed(live, first, family)
    check_health_idle(live, family)

    assert complete(live, "other")  # the budget holds one: the idle family is evicted
    assert [g.spec.name for g in live.hub.resident] == ["other"]
    wait_freed(live, second, family)
    assert complete(live, family) == want  # generation 3, loaded again by residency
    assert generation_of(live, family) > second
    check_health_idle(live, family)


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_refused_at_load_in_one_line_and_the_others_keep_serving(
        live: Live, name: str) -> None:
    family = FAMILIES[0]
    assert complete(live, family) == live.reference(family, NUM_TOKENS)
    r = httpx.post(live.url + "/completion", json=body(name, NUM_TOKENS), timeout=300)
    assert r.status_code in (400, 422, 500), r.text
    message = r.json()["error"]["message"]
    assert "\n" not in message and f"'{name}'" in message
    reason = {"missing-tensor": "o_proj.weight", "unknown-layers": "mystery_mixer",
              "unmapped-gguf": "unsupported GGUF architecture 'mamba2'"}[name]
    assert reason in message, message
    info = httpx.get(live.url + "/admin/models", timeout=10).json()
    assert info["last_error"]["model"] == name and "\n" not in info["last_error"]["message"]
    assert complete(live, family) == live.reference(family, NUM_TOKENS)
    assert family in [g.spec.name for g in live.hub.resident]
