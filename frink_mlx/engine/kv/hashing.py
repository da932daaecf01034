"""Chained, stable hashes of full KV blocks: the keys of the prefix cache.

Why chained: the K/V stored for a token depends on every token before it, so a
block may only be reused when the *whole prefix* up to and including it is the
same. Hashing each full block together with its parent's hash makes the hash of
block i a fingerprint of tokens [0, (i+1)*block_size):

    tokens   t0 t1 t2 t3 | t4 t5 t6 t7 | t8 t9 t10 t11 | t12 t13      (block_size 4)
    hashes   h0 = H(None, t0..t3, x)
                           h1 = H(h0, t4..t7, x)
                                         h2 = H(h1, t8..t11, x)
                                                         (partial: never hashed)

Why an extra key `x`: it separates cache namespaces that hold the same token
ids but different K/V or different trust domains. frink-mlx passes
`make_extra_key(model_generation, cache_salt)`, so a model swap (new generation)
or a different `cache_salt` never shares a block; with the SSD tier the
generation is replaced by the namespace of the model's content (spill.py
rule 1), so the same weights loaded again find their blocks on disk. It is folded into every
block's hash (not only the first) so a hash is self-describing.

Why a real digest instead of Python's `hash()`: `hash()` of str is salted per
process and 64-bit; blake2b over a canonical byte encoding is stable across
runs and machines, and its 128-bit output makes collisions negligible, so a
lookup trusts the hash without re-comparing token ids (vLLM does the same).

Canonical encoding (the rules, in order):
 1. Every value is type-tagged, so `1`, `True`, `"1"` and `b"1"` differ.
 2. Ints are written in decimal and terminated by `;` (any size, any sign).
 3. str/bytes carry their byte length, tuples their item count, so nothing
    can be shifted across a boundary.
 4. Token ids are packed little-endian signed 64-bit after their count.
 5. The digest is personalised (`frink-kv-v1`) so a future encoding change
    gets a fresh namespace instead of silently mixing with old hashes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence

from ...errors import EngineFailure

_PERSON = b"frink-kv-v1"
_DIGEST_SIZE = 16


def make_extra_key(generation: int | str, cache_salt: str | None) -> tuple[int | str, str | None]:
    """The extra key every engine uses: one model generation (or, with the SSD tier, the
    namespace of the model's content: spill.py rule 1), one cache salt."""
    return (generation, cache_salt)


def _encode(value: object, out: bytearray) -> None:
    """Append the canonical, type-tagged encoding of `value` to `out`."""
    if value is None:
        out += b"N"
    elif isinstance(value, bool):  # before int: bool is an int subclass
        out += b"T" if value else b"F"
    elif isinstance(value, int):
        out += b"I" + str(value).encode("ascii") + b";"
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"S" + str(len(raw)).encode("ascii") + b";" + raw
    elif isinstance(value, bytes):
        out += b"B" + str(len(value)).encode("ascii") + b";" + value
    elif isinstance(value, tuple):
        out += b"(" + str(len(value)).encode("ascii") + b";"
        for item in value:
            _encode(item, out)
    else:
        raise EngineFailure(
            f"extra key holds a {type(value).__name__}; only None, bool, int, str, "
            "bytes and tuples of them can be hashed",
            param="extra",
        )


def hash_block(parent: int | None, token_ids: Sequence[int], extra: tuple = ()) -> int:
    """Hash one full block given its parent block's hash (None for block 0)."""
    if not isinstance(extra, tuple):
        raise EngineFailure(f"extra must be a tuple, got {type(extra).__name__}", param="extra")
    buf = bytearray()
    _encode(parent, buf)
    _encode(extra, buf)
    buf += b"K" + str(len(token_ids)).encode("ascii") + b";"
    try:
        buf += struct.pack(f"<{len(token_ids)}q", *token_ids)
    except struct.error as exc:
        raise EngineFailure(
            f"token_ids must be ints in the signed 64-bit range ({exc})", param="token_ids"
        ) from exc
    digest = hashlib.blake2b(bytes(buf), digest_size=_DIGEST_SIZE, person=_PERSON).digest()
    return int.from_bytes(digest, "little")


def iter_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    extra: tuple = (),
    *,
    parent: int | None = None,
    start_block: int = 0,
    stop_block: int | None = None,
) -> Iterator[int]:
    """Yield the chained hashes of full blocks `start_block, start_block+1, ...`.

    `parent` must be the hash of block `start_block - 1` (None when starting at
    block 0). Stops at `stop_block` (exclusive) or at the last *full* block of
    `token_ids`, whichever comes first; a trailing partial block is never hashed.
    The caller may stop iterating early (a prefix lookup stops at its first miss),
    so nothing past the miss is hashed.
    """
    if block_size <= 0:
        raise EngineFailure(f"block_size must be positive, got {block_size}", param="block_size")
    num_full = len(token_ids) // block_size
    end = num_full if stop_block is None else min(stop_block, num_full)
    # Block i covers token indices [i*block_size, (i+1)*block_size).
    for i in range(start_block, end):
        parent = hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra)
        yield parent
