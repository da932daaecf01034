"""The SSD tier under real engines (engine/kv/spill.py, disk.py): a second engine on the
same cache directory -- a restarted daemon, a reloaded model -- reads a prompt's blocks
back and answers exactly as a cold engine; every kind of bad file is refused, deleted and
recomputed; the byte budget holds; a read-only directory turns the tier off."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from engine_support import engine_factory, greedy, loaded, random_prompt

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.kv.disk import DiskTier
from frink_mlx.engine.kv.hashing import iter_block_hashes, make_extra_key
from frink_mlx.engine.types import SeqRequest

GREEDY = SamplingParams(temperature=0)
BLOCK = 4
PROMPT = random_prompt(11, 61)          # 15 full blocks below the rule-1 cap
CAP_TOKENS = (len(PROMPT) - 1) // BLOCK * BLOCK


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return loaded(tiny_llama_dir)


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    from conftest import make_tiny_llama

    return loaded(make_tiny_llama(tmp_path_factory.mktemp("other"), seed=5))


@pytest.fixture
def make_engine():
    for make in engine_factory(num_blocks=64, prefill_chunk_tokens=16, context_ceiling=128):
        yield make


def run(engine, prompt, name="r", n=6):
    outs = list(engine.submit(SeqRequest(name, prompt, GREEDY, n)))
    return [o.token_id for o in outs], outs[0]


def files(directory: Path) -> list[Path]:
    return sorted(directory.glob("??/*.kvb"))


def warm(make_engine, model, directory: Path, prompt=PROMPT) -> tuple[list[int], list[Path]]:
    """One engine answers `prompt` cold and writes its blocks (its shutdown flushes); its
    tokens and the files of the prompt's blocks, in chain order."""
    tier = DiskTier(directory, 1 << 30)
    engine = make_engine(model, disk=tier)
    tokens, first = run(engine, prompt)
    assert first.num_disk_cached_tokens == 0
    engine.shutdown(5.0)
    assert tier.wait_idle(10.0)
    tier.close(5.0)
    extra = make_extra_key(engine.scheduler.cache_namespace, None)
    names = [f"{h:032x}" for h in iter_block_hashes(prompt, BLOCK, extra)]
    return tokens, [directory / name[:2] / f"{name}.kvb" for name in names]


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_second_engine_reads_the_prompt_back_and_answers_the_same(tiny, make_engine, tmp_path,
                                                                    pipeline):
    cold, chain = warm(make_engine, tiny, tmp_path)
    assert cold == greedy(tiny, PROMPT, 6)
    assert all(path.is_file() for path in chain) and len(chain) == CAP_TOKENS // BLOCK
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make_engine(tiny, disk=tier, pipeline=pipeline)
    tokens, first = run(engine, PROMPT)
    assert tokens == cold
    assert first.num_cached_tokens == first.num_disk_cached_tokens == CAP_TOKENS
    stats = tier.snapshot()
    assert stats.hit_blocks_total == CAP_TOKENS // BLOCK and stats.refused_files_total == 0
    # now in RAM: the next request hits there, not on disk
    again, first = run(engine, PROMPT, "again")
    assert again == cold and first.num_cached_tokens == CAP_TOKENS
    assert first.num_disk_cached_tokens == 0
    assert engine.stats().extra["disk_hit_tokens_total"] == CAP_TOKENS
    tier.close(5.0)


def test_a_longer_prompt_continues_from_ram_with_disk_blocks(tiny, make_engine, tmp_path):
    warm(make_engine, tiny, tmp_path)
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make_engine(tiny, disk=tier)
    _, first = run(engine, PROMPT[:21])  # blocks 0-4 read back, now in RAM
    assert first.num_disk_cached_tokens == 20
    longer = PROMPT + random_prompt(12, 7)  # blocks 0-14 are PROMPT's, block 15 is new
    tokens, first = run(engine, longer, "longer")
    assert tokens == greedy(tiny, longer, 6)
    assert first.num_cached_tokens == 60 and first.num_disk_cached_tokens == 40
    tier.close(5.0)


def corrupt_truncate(path: Path, data: bytes) -> bytes:
    return data[: len(data) // 2]


def corrupt_flip(path: Path, data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[len(data) - 7] ^= 0xFF
    return bytes(flipped)


def corrupt_header(path: Path, data: bytes) -> bytes:
    flipped = bytearray(data)
    flipped[9] ^= 0x01  # the format version: an older layout
    return bytes(flipped)


@pytest.mark.parametrize("damage", [corrupt_truncate, corrupt_flip, corrupt_header])
def test_a_damaged_file_is_refused_deleted_and_recomputed(tiny, make_engine, tmp_path, damage):
    cold, chain = warm(make_engine, tiny, tmp_path)
    hurt = chain[7]
    hurt.write_bytes(damage(hurt, hurt.read_bytes()))
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make_engine(tiny, disk=tier)
    tokens, first = run(engine, PROMPT)
    assert tokens == cold
    assert first.num_disk_cached_tokens == first.num_cached_tokens == 7 * BLOCK
    assert tier.snapshot().refused_files_total == 1
    engine.shutdown(5.0)  # the recomputed block is written again, whole
    tier.wait_idle(10.0)
    again = make_engine(tiny, disk=tier)
    tokens, first = run(again, PROMPT)
    assert tokens == cold and first.num_disk_cached_tokens == CAP_TOKENS
    tier.close(5.0)


def test_every_file_damaged_still_answers_as_cold(tiny, make_engine, tmp_path):
    cold, _ = warm(make_engine, tiny, tmp_path)
    for path in files(tmp_path):
        path.write_bytes(corrupt_flip(path, path.read_bytes()))
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make_engine(tiny, disk=tier)
    tokens, first = run(engine, PROMPT)
    assert tokens == cold and first.num_disk_cached_tokens == 0
    assert tier.snapshot().refused_files_total == 1  # the first block; the rest never read
    tier.close(5.0)


def test_another_models_file_under_the_right_name_is_refused(tiny, other, make_engine, tmp_path):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    cold, chain = warm(make_engine, tiny, mine)
    _, foreign = warm(make_engine, other, theirs)
    assert {p.name for p in chain}.isdisjoint({p.name for p in foreign})  # namespaces
    chain[0].write_bytes(foreign[0].read_bytes())  # the other model's block 0, our name
    tier = DiskTier(mine, 1 << 30)
    engine = make_engine(tiny, disk=tier)
    tokens, first = run(engine, PROMPT)
    assert tokens == cold and first.num_disk_cached_tokens == 0
    assert tier.snapshot().refused_files_total == 1
    tier.close(5.0)


def test_the_budget_is_never_exceeded(tiny, make_engine, tmp_path):
    tier = DiskTier(tmp_path, 1 << 30)
    engine = make_engine(tiny, disk=tier)
    run(engine, PROMPT)
    engine.shutdown(5.0)
    tier.wait_idle(10.0)
    per_file = files(tmp_path)[0].stat().st_size
    tier.close(5.0)
    budget = per_file * 6 + per_file // 2
    for path in files(tmp_path):
        path.unlink()
    tier = DiskTier(tmp_path, budget)
    engine = make_engine(tiny, disk=tier)
    for i in range(4):
        prompt = random_prompt(100 + i, 33)
        assert run(engine, prompt, f"p{i}")[0] == greedy(tiny, prompt, 6)
        tier.wait_idle(10.0)
        assert sum(p.stat().st_size for p in files(tmp_path)) <= budget
    stats = tier.snapshot()
    assert stats.used_bytes <= budget and stats.evicted_files_total > 0
    assert len(files(tmp_path)) == stats.num_files == 6
    tier.close(5.0)


@pytest.mark.parametrize("how", ["read-only", "not a directory"])
def test_an_unwritable_directory_turns_the_tier_off_with_one_warning(tiny, make_engine, tmp_path,
                                                                     caplog, how):
    if how == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only directories")
        directory = tmp_path / "ro"
        directory.mkdir()
        directory.chmod(stat.S_IRUSR | stat.S_IXUSR)
    else:
        (tmp_path / "file").write_text("x")
        directory = tmp_path / "file" / "kv"
    try:
        tier = DiskTier(directory, 1 << 30)
        engine = make_engine(tiny, disk=tier)
        for i in range(2):
            assert run(engine, PROMPT, f"r{i}")[0] == greedy(tiny, PROMPT, 6)
    finally:
        tmp_path.chmod(stat.S_IRWXU)
        if directory.exists():
            directory.chmod(stat.S_IRWXU)
    warnings = [r for r in caplog.records if "KV disk tier off" in r.getMessage()]
    assert len(warnings) == 1 and not tier.enabled
    assert engine.scheduler.cache_namespace is None  # the engine runs as without a tier


def test_a_full_disk_turns_the_tier_off_with_one_warning(tiny, make_engine, tmp_path, caplog,
                                                         monkeypatch):
    tier = DiskTier(tmp_path, 1 << 30)
    real_open = open

    def full(path, mode="r", *args, **kwargs):
        if "w" in mode and ".tmp" in str(path):
            raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full)
    engine = make_engine(tiny, disk=tier)
    for i in range(3):
        prompt = random_prompt(200 + i, 25)
        assert run(engine, prompt, f"p{i}")[0] == greedy(tiny, prompt, 6)
        tier.wait_idle(10.0)
    warnings = [r for r in caplog.records if "KV disk tier off" in r.getMessage()]
    assert len(warnings) == 1 and not tier.enabled
    assert files(tmp_path) == [] and not list(tmp_path.glob("??/*.tmp*"))
    tier.close(5.0)


def test_a_swap_back_to_the_same_weights_reads_its_blocks(tiny, other, make_engine, tmp_path):
    tier = DiskTier(tmp_path, 1 << 30)
    first_gen = make_engine(tiny, disk=tier, generation=1)
    cold, _ = run(first_gen, PROMPT)
    first_gen.shutdown(5.0)
    swapped = make_engine(other, disk=tier, generation=2)
    _, first = run(swapped, PROMPT)
    assert first.num_disk_cached_tokens == 0  # another model's namespace
    swapped.shutdown(5.0)
    back = make_engine(tiny, disk=tier, generation=3)
    tokens, first = run(back, PROMPT)
    assert tokens == cold and first.num_disk_cached_tokens == CAP_TOKENS
    tier.close(5.0)


def test_without_a_tier_nothing_changes(tiny, make_engine):
    engine = make_engine(tiny)
    tokens, first = run(engine, PROMPT)
    assert tokens == greedy(tiny, PROMPT, 6) and first.num_disk_cached_tokens is None

