"""The SSD tier beyond float llamas (engine/kv/diskparts.py, spill.py): hybrid models'
state snapshots, sliding-window models' window parts and kv_bits pools go to disk and
come back. A second engine on the same directory (a restarted daemon, a reloaded model)
answers greedy exactly as a cold engine and as mlx-lm; a bad state file (truncated,
flipped, another model's under the right name) is refused, deleted and recomputed; a
run of blocks without a state at its end is used only up to the last snapshot in it,
and a window part missing shortens the hit to where the window still holds."""

from __future__ import annotations

import functools
import types
from pathlib import Path

import mlx.core as mx
import pytest
from engine_support import engine_factory, loaded
from hybrid_support import build, engine_for, prompts, reference

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.kv.blockfile import KIND_STATE, KIND_WINDOW
from frink_mlx.engine.kv.disk import DiskTier
from frink_mlx.engine.kv.diskparts import derived_key
from frink_mlx.engine.kv.hashing import iter_block_hashes, make_extra_key
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
BLOCK = 4
PROMPT = prompts(21, (37,))[0]      # cap: 9 blocks, 36 tokens (manager rule 1)
CAP = (len(PROMPT) - 1) // BLOCK * BLOCK


@pytest.fixture
def make_engine():
    yield from engine_factory(num_blocks=128, prefill_chunk_tokens=8, context_ceiling=256)


def run(engine, prompt, name, n=6):
    outs = list(engine.submit(SeqRequest(name, prompt, GREEDY, n)))
    return [o.token_id for o in outs], outs[0]


def path_of(directory: Path, key: int) -> Path:
    name = f"{key:032x}"
    return directory / name[:2] / f"{name}.kvb"


def warm(make_engine, family, directory, **kw):
    """A cold engine answers PROMPT and flushes to `directory` at shutdown; its tokens and
    the prompt's block hashes."""
    tier = DiskTier(directory, 1 << 30)
    engine = engine_for(make_engine, family, disk=tier, **kw)
    tokens, first = run(engine, PROMPT, "cold")
    assert first.num_disk_cached_tokens == 0
    engine.shutdown(5.0)
    assert tier.wait_idle(10.0)
    tier.close(5.0)
    extra = make_extra_key(engine.scheduler.cache_namespace, None)
    return tokens, list(iter_block_hashes(PROMPT, BLOCK, extra))


def restart(make_engine, family, directory, **kw):
    tier = DiskTier(directory, 1 << 30)
    engine = engine_for(make_engine, family, disk=tier, **kw)
    return tier, engine, run(engine, PROMPT, "warm")


# -- hybrids: the state snapshots go to the tier (issue 31's last point) ----------------

HYBRID = dict(snapshot_interval_blocks=4)  # kept at 16, 32 and the prompt's end, 36


@pytest.mark.parametrize(("family", "pipeline"), [("qwen3_5", False), ("qwen3_5", True),
                                                  ("nemotron_h", False), ("lfm2", False)])
def test_a_restarted_hybrid_restores_blocks_and_state_from_disk(make_engine, tmp_path, family,
                                                                pipeline):
    cold, hashes = warm(make_engine, family, tmp_path, **HYBRID)
    assert cold == reference(family, tuple(PROMPT), 6)
    assert path_of(tmp_path, derived_key(KIND_STATE, hashes[CAP // BLOCK - 1])).is_file()
    tier, engine, (tokens, first) = restart(make_engine, family, tmp_path, pipeline=pipeline,
                                            **HYBRID)
    assert tokens == cold
    assert first.num_cached_tokens == first.num_disk_cached_tokens == CAP
    assert tier.snapshot().refused_files_total == 0
    again, first = run(engine, PROMPT, "again")  # now in RAM, state snapshot included
    assert again == cold and first.num_cached_tokens == CAP and first.num_disk_cached_tokens == 0
    tier.close(5.0)


def test_blocks_without_a_state_at_their_end_are_used_up_to_the_last_snapshot(make_engine,
                                                                            tmp_path):
    cold, hashes = warm(make_engine, "qwen3_5", tmp_path, **HYBRID)
    path_of(tmp_path, derived_key(KIND_STATE, hashes[CAP // BLOCK - 1])).unlink()  # the 36's
    tier, _, (tokens, first) = restart(make_engine, "qwen3_5", tmp_path, **HYBRID)
    assert tokens == cold
    assert first.num_cached_tokens == first.num_disk_cached_tokens == 32  # the interval's
    tier.close(5.0)


def truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


def flip(data: bytes) -> bytes:
    out = bytearray(data)
    out[len(data) - 5] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize("damage", [truncate, flip, "another model"])
def test_a_bad_state_file_is_refused_deleted_and_recomputed(make_engine, tmp_path, damage):
    mine = tmp_path / "mine"
    cold, hashes = warm(make_engine, "qwen3_5", mine, **HYBRID)
    state = path_of(mine, derived_key(KIND_STATE, hashes[CAP // BLOCK - 1]))
    if damage == "another model":
        other = types.SimpleNamespace(model=build("qwen3_5", seed=5), dtype=mx.float32,
                                      context_length=512)
        tier = DiskTier(tmp_path / "theirs", 1 << 30)
        foreign = make_engine(other, disk=tier, **HYBRID)
        run(foreign, PROMPT, "theirs")
        foreign.shutdown(5.0)
        tier.close(5.0)
        extra = make_extra_key(foreign.scheduler.cache_namespace, None)
        theirs = list(iter_block_hashes(PROMPT, BLOCK, extra))[CAP // BLOCK - 1]
        state.write_bytes(path_of(tmp_path / "theirs", derived_key(KIND_STATE, theirs))
                          .read_bytes())  # their state after the same tokens, our name
    else:
        state.write_bytes(damage(state.read_bytes()))
    tier, engine, (tokens, first) = restart(make_engine, "qwen3_5", mine, **HYBRID)
    assert tokens == cold and first.num_disk_cached_tokens == first.num_cached_tokens == 0
    assert tier.snapshot().refused_files_total == 1
    engine.shutdown(5.0)  # deleted, then written again, whole, from the recomputed state
    tier.wait_idle(10.0)
    assert state.is_file()
    again = engine_for(make_engine, "qwen3_5", disk=tier, **HYBRID)
    tokens, first = run(again, PROMPT, "again")
    assert tokens == cold and first.num_disk_cached_tokens == CAP
    tier.close(5.0)


# -- sliding windows: full parts and the window parts a hit reads -----------------------

@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "gemma4_text"])
def test_a_restarted_window_model_answers_from_disk_exactly(make_engine, tmp_path, family):
    cold, _ = warm(make_engine, family, tmp_path)
    assert cold == reference(family, tuple(PROMPT), 6)
    tier, engine, (tokens, first) = restart(make_engine, family, tmp_path)
    assert tokens == cold
    assert first.num_cached_tokens == first.num_disk_cached_tokens == CAP
    longer = PROMPT + prompts(22, (9,))[0]  # past the disk run: RAM blocks, then prefill
    tokens, first = run(engine, longer, "longer")
    assert tokens == reference(family, tuple(longer), 6) and first.num_cached_tokens >= CAP
    tier.close(5.0)


def test_a_missing_window_part_shortens_the_hit_to_where_the_window_holds(make_engine,
                                                                         tmp_path):
    """Window 6 (+1, kv/window.py rule 4): a hit of 36 tokens reads the window parts of
    blocks 7 and 8; without block 8's the deepest hit is 32 (blocks 6 and 7)."""
    cold, hashes = warm(make_engine, "gemma3_text", tmp_path)
    path_of(tmp_path, derived_key(KIND_WINDOW, hashes[8])).unlink()
    tier, _, (tokens, first) = restart(make_engine, "gemma3_text", tmp_path)
    assert tokens == cold and first.num_cached_tokens == first.num_disk_cached_tokens == 32
    tier.close(5.0)


# -- kv_bits: the quantized parts (words, scales, biases) as they are ------------------

@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    from conftest import make_tiny_llama

    return loaded(make_tiny_llama(tmp_path_factory.mktemp("tiny64"), hidden_size=128,
                                  num_attention_heads=2, num_key_value_heads=1))


@pytest.mark.parametrize("bits", [8, 4])
def test_kv_bits_blocks_come_back_from_disk_exactly(make_engine, tiny64, tmp_path, bits):
    make = functools.partial(make_engine, tiny64, kv_bits=bits)
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make(disk=tier)
    assert engine._loop.spill is not None
    cold, first = run(engine, PROMPT, "cold")
    engine.shutdown(5.0)
    tier.wait_idle(10.0)
    files = sorted(tmp_path.glob("??/*.kvb"))
    assert len(files) == CAP // BLOCK + 1  # the prompt's blocks and one of output
    again = make(disk=tier)
    tokens, first = run(again, PROMPT, "warm")
    assert tokens == cold
    assert first.num_cached_tokens == first.num_disk_cached_tokens == CAP
    assert tier.snapshot().refused_files_total == 0
    plain = make_engine(tiny64, disk=tier)  # float KV: another namespace, nothing read
    tokens, first = run(plain, PROMPT, "float")
    assert first.num_disk_cached_tokens == 0
    tier.close(5.0)
