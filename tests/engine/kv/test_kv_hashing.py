"""Chained block hashes: stable, chained, namespaced by the extra key."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from frink_mlx.engine.kv.hashing import hash_block, iter_block_hashes, make_extra_key
from frink_mlx.errors import EngineFailure

EXTRA = make_extra_key(0, None)

# Pinned so an accidental change of the canonical encoding is caught: hashes are
# compared across engine generations and benchmark runs.
GOLDEN_BLOCK0 = 0xCBCD45C87C3093FD888FF6B975E68AD3


def test_golden_value_is_stable() -> None:
    assert hash_block(None, [1, 2, 3, 4], EXTRA) == GOLDEN_BLOCK0


def test_stable_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from frink_mlx.engine.kv.hashing import hash_block;"
        "print(hash_block(None, [1, 2, 3, 4], (0, None)), hash_block(7, [5], (1, 'salt')))"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        outputs.add(run.stdout.strip())
    assert outputs == {f"{GOLDEN_BLOCK0} {hash_block(7, [5], (1, 'salt'))}"}


def test_same_tokens_after_a_different_parent_hash_differently() -> None:
    parent_a = hash_block(None, [1, 2, 3, 4], EXTRA)
    parent_b = hash_block(None, [9, 9, 9, 9], EXTRA)
    assert hash_block(parent_a, [5, 6, 7, 8], EXTRA) != hash_block(parent_b, [5, 6, 7, 8], EXTRA)
    assert hash_block(None, [5, 6, 7, 8], EXTRA) != hash_block(parent_a, [5, 6, 7, 8], EXTRA)


def test_salt_and_generation_separate_namespaces() -> None:
    tokens = [1, 2, 3, 4]
    keys = [make_extra_key(0, None), make_extra_key(0, "alice"), make_extra_key(0, "bob"),
            make_extra_key(1, None), make_extra_key(0, "")]
    assert len({hash_block(None, tokens, key) for key in keys}) == len(keys)


def test_encoding_is_type_tagged_and_length_prefixed() -> None:
    tokens = [1, 2, 3, 4]
    extras = [(1,), (True,), ("1",), (b"1",), ((1,),), (None,), ("ab", "c"), ("a", "bc"), ()]
    assert len({hash_block(None, tokens, extra) for extra in extras}) == len(extras)
    # token order and count matter
    assert hash_block(None, [1, 2], EXTRA) != hash_block(None, [2, 1], EXTRA)
    assert hash_block(None, [1, 2], EXTRA) != hash_block(None, [1, 2, 0], EXTRA)


def test_bad_inputs_raise_naming_the_field() -> None:
    with pytest.raises(EngineFailure) as err:
        hash_block(None, [1, 2], [0, None])  # type: ignore[arg-type]
    assert err.value.param == "extra"
    with pytest.raises(EngineFailure) as err:
        hash_block(None, [1, 2], (0, 1.5))
    assert err.value.param == "extra"
    with pytest.raises(EngineFailure) as err:
        hash_block(None, [1, 2**70], EXTRA)
    assert err.value.param == "token_ids"


def test_iter_block_hashes_chains_full_blocks_only() -> None:
    tokens = list(range(14))  # blocks [0..3] [4..7] [8..11], partial [12, 13]
    h0 = hash_block(None, [0, 1, 2, 3], EXTRA)
    h1 = hash_block(h0, [4, 5, 6, 7], EXTRA)
    h2 = hash_block(h1, [8, 9, 10, 11], EXTRA)
    assert list(iter_block_hashes(tokens, 4, EXTRA)) == [h0, h1, h2]
    # resuming from block 2 with its parent gives the same tail of the chain
    assert list(iter_block_hashes(tokens, 4, EXTRA, parent=h1, start_block=2)) == [h2]
    assert list(iter_block_hashes(tokens, 4, EXTRA, stop_block=2)) == [h0, h1]
    assert list(iter_block_hashes(tokens[:3], 4, EXTRA)) == []
