"""The SSD tier without a model: the block file format (blockfile.py rule 1: every kind of
bad file is refused, naming why) and the tier's files, budget, queue and threads
(disk.py rules 1-6), with tiny layouts and hand-made payloads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from frink_mlx.engine.kv.blockfile import (
    HEADER_NBYTES,
    KIND_BLOCK,
    KIND_STATE,
    BadBlockFile,
    BlockLayout,
    decode,
    encode_header,
)
from frink_mlx.engine.kv.disk import DiskTier, ReadJob, WriteJob

LAYOUT = BlockLayout(namespace=b"n" * 16, kind=KIND_BLOCK, dims=(2, 4, 0, 0, 2, 16),
                     dtype="float32", payload_nbytes=2 * 4 * (2 + 2) * 4)
PER_FILE = LAYOUT.file_nbytes


def payload(seed: int) -> bytes:
    return bytes((seed * 7 + i) % 256 for i in range(LAYOUT.payload_nbytes))


def whole_file(block_hash: int, seed: int) -> bytes:
    data = payload(seed)
    return encode_header(LAYOUT, block_hash, data) + data


def test_a_file_round_trips() -> None:
    assert bytes(decode(LAYOUT, 42, whole_file(42, 1))) == payload(1)
    assert HEADER_NBYTES == 116 and PER_FILE == HEADER_NBYTES + 2 * 4 * (2 + 2) * 4


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x40
    return bytes(out)


@pytest.mark.parametrize(("damage", "why"), [
    (lambda d: d[:50], "truncated header"),
    (lambda d: d[:-1], "payload of"),
    (lambda d: d + b"x", "payload of"),
    (lambda d: _flip(d, 0), "magic"),
    (lambda d: _flip(d, 8), "format version"),
    (lambda d: _flip(d, 40), "header checksum"),
    (lambda d: _flip(d, len(d) - 1), "payload checksum"),
])
def test_bad_files_are_refused_naming_why(damage, why) -> None:
    with pytest.raises(BadBlockFile, match=why):
        decode(LAYOUT, 42, damage(whole_file(42, 1)))


def test_another_namespace_block_or_layout_is_refused() -> None:
    data = whole_file(42, 1)
    other = BlockLayout(**{**{f: getattr(LAYOUT, f) for f in LAYOUT.__slots__},
                           "namespace": b"m" * 16})
    with pytest.raises(BadBlockFile, match="namespace"):
        decode(other, 42, data)
    with pytest.raises(BadBlockFile, match="another block"):
        decode(LAYOUT, 43, data)
    wider = BlockLayout(**{**{f: getattr(LAYOUT, f) for f in LAYOUT.__slots__},
                           "dims": (2, 4, 0, 0, 2, 32), "payload_nbytes": 2 * LAYOUT.payload_nbytes})
    wide_payload = bytes(wider.payload_nbytes)
    forged = encode_header(wider, 42, wide_payload)[:12] + data[12:]  # our namespace, their body
    with pytest.raises(BadBlockFile):
        decode(LAYOUT, 42, forged + wide_payload)
    state = BlockLayout(**{**{f: getattr(LAYOUT, f) for f in LAYOUT.__slots__}, "kind": KIND_STATE})
    with pytest.raises(BadBlockFile, match="kind"):  # a state file under a block's name
        decode(LAYOUT, 42, encode_header(state, 42, payload(1)) + payload(1))


def write(tier: DiskTier, hashes: list[int]) -> None:
    assert tier.offer(WriteJob(LAYOUT, hashes, lambda i: payload(hashes[i])))
    assert tier.wait_idle(10.0)


def read(tier: DiskTier, hashes: list[int]) -> list[bytes]:
    got: list[list[bytes]] = []
    done = threading.Event()

    def deliver(payloads):
        got.append([bytes(p) for p in payloads])
        done.set()

    assert tier.read(ReadJob([LAYOUT] * len(hashes), hashes, deliver))
    assert done.wait(10.0)
    return got[0]


def test_write_read_and_the_leading_run(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 20)
    write(tier, [1, 2, 3])
    assert (tmp_path / f"{1:032x}"[:2] / f"{1:032x}.kvb").is_file()
    assert tier.leading_run([1, 2, 3, 4, 5]) == 3 and tier.leading_run([2, 9, 3]) == 1
    assert read(tier, [1, 2, 3, 4]) == [payload(1), payload(2), payload(3)]
    stats = tier.snapshot()
    assert (stats.num_files, stats.used_bytes, stats.written_blocks_total) == (3, 3 * PER_FILE, 3)
    assert stats.hit_blocks_total == 3 and stats.read_requests_total == 1
    write(tier, [2, 3])  # already there: not written again
    assert tier.snapshot().written_blocks_total == 3
    tier.close(5.0)


def test_a_refused_file_stops_the_run_and_is_deleted(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 20)
    write(tier, [1, 2, 3])
    middle = tmp_path / f"{2:032x}"[:2] / f"{2:032x}.kvb"
    middle.write_bytes(_flip(middle.read_bytes(), PER_FILE - 3))
    assert read(tier, [1, 2, 3]) == [payload(1)]
    assert not middle.exists() and not tier.has(2) and tier.has(3)
    stats = tier.snapshot()
    assert stats.refused_files_total == 1 and stats.num_files == 2
    tier.close(5.0)


def test_the_budget_evicts_least_recently_used_first(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 3 * PER_FILE + PER_FILE // 2)
    write(tier, [1, 2, 3])
    read(tier, [1])           # 1 is now the most recently used
    tier.touch(2)             # ... then 2 (a block still in use in RAM)
    write(tier, [4])          # evicts 3
    assert [tier.has(h) for h in (1, 2, 3, 4)] == [True, True, False, True]
    write(tier, [5, 6])       # evicts 1, then 2
    assert [tier.has(h) for h in (1, 2, 4, 5, 6)] == [False, False, True, True, True]
    files = sorted(tmp_path.glob("??/*.kvb"))
    assert len(files) == 3 and sum(f.stat().st_size for f in files) <= tier.budget_bytes
    assert tier.snapshot().evicted_files_total == 3
    tier.close(5.0)


def test_a_restart_keeps_the_files_in_mtime_order_and_trims_to_the_budget(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 20)
    write(tier, [1, 2, 3])
    tier.close(5.0)
    now = time.time()
    for age, block_hash in ((30, 2), (20, 3), (10, 1)):  # oldest first: 2, 3, 1
        path = tmp_path / f"{block_hash:032x}"[:2] / f"{block_hash:032x}.kvb"
        os.utime(path, (now - age, now - age))
    stale = tmp_path / "00" / "dead.tmp123"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"torn")
    os.utime(stale, (now - 3600, now - 3600))
    again = DiskTier(tmp_path, 2 * PER_FILE)
    assert [again.has(h) for h in (1, 2, 3)] == [True, False, True]
    assert not stale.exists() and again.snapshot().used_bytes == 2 * PER_FILE
    again.close(5.0)


def test_a_full_queue_refuses_instead_of_waiting(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 20, queue_bytes=2 * PER_FILE)
    gate = threading.Event()

    def slow(i: int) -> bytes:
        gate.wait(10.0)
        return payload(i)

    assert tier.offer(WriteJob(LAYOUT, [1], slow))          # taken by the writer
    while tier.room_bytes() < 2 * PER_FILE:
        time.sleep(0.01)
    assert tier.offer(WriteJob(LAYOUT, [2, 3], slow))       # queued: the queue is full
    started = time.monotonic()
    assert not tier.offer(WriteJob(LAYOUT, [4], slow))      # refused at once
    assert time.monotonic() - started < 0.5 and tier.room_bytes() == 0
    gate.set()
    assert tier.wait_idle(10.0)
    stats = tier.snapshot()
    assert stats.dropped_blocks_total == 1 and stats.written_blocks_total == 3
    tier.close(5.0)


def test_an_unwritable_directory_turns_the_tier_off_once(tmp_path: Path, caplog) -> None:
    (tmp_path / "file").write_text("x")
    tier = DiskTier(tmp_path / "file" / "kv", 1 << 20)
    assert not tier.enabled and tier.snapshot().error
    assert not tier.offer(WriteJob(LAYOUT, [1], payload)) and not tier.has(1)
    assert not tier.read(ReadJob([LAYOUT], [1], lambda p: None))
    assert len([r for r in caplog.records if "KV disk tier off" in r.getMessage()]) == 1
    tier.close(1.0)
