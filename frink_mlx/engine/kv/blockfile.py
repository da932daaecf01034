"""One file of the SSD tier: a self-checking header, then a block's K and V bytes (or the
recurrent state after it).

Why a format of its own: a file found under a block's name may be torn (the
daemon was killed mid-write, the disk filled), flipped (bad media), from
another model (copied, or a hash collision across namespaces we never want
to trust blindly) or from an older layout of this very code. Each of those
must be *refused*, never loaded: loading it would put wrong K/V under a
prompt and produce wrong tokens without any error. So every file says what
it holds and carries a checksum of it, and `decode` checks all of it against
what the reader expects before a byte of payload is used.

Layout (little-endian), HEADER_NBYTES bytes, then the payload:

    offset  size  field
       0      8   magic  b"FRKVBLK\\0"
       8      2   format version (FORMAT_VERSION)
      10      2   kind: KIND_BLOCK, KIND_WINDOW or KIND_STATE (below)
      12     16   namespace: the digest of the model's content identity, its KV dtype and
                  every layer's layout, bits and state shapes (`BlockLayout.namespace`,
                  diskparts.py rule 1)
      28     16   the file's key: a block's chained hash (hashing.py), or a key derived
                  from it for the other kinds (diskparts.py rule 2), 128 bits
      44     24   six u32 dims, what the kind's payload is shaped by (below)
      68     16   dtype names, ASCII, NUL-padded ("float32", "uint32+float16", ...)
      84      8   payload length in bytes
      92     16   xxh3-128 of the payload
     108      8   xxh3-64 of bytes [0, 108) (the header itself)

    kinds and their payloads (diskparts.py writes and reads them):
      KIND_BLOCK   one block of the full-attention layers' pools (every layer where the
                   model has no sliding window); dims (layers, block_size, bits, group
                   size, pool lists, bytes per token)
      KIND_WINDOW  the same block of the sliding-window layers' pools
      KIND_STATE   the recurrent state after that block; dims (state layers, arrays,
                   block_size, 0, 0, bytes)
      a block payload: for each pool list (K, V; or K words, scales, biases, V words,
      scales, biases when quantized), for each layer, its (n_kv_heads, block_size, dim)
      slab in C order as the pool's raw bytes; a state payload: each layer's arrays,
      in order, as their raw bytes

Rules:
1. `decode` refuses (raises `BadBlockFile`, naming why) a file that is shorter
   than its header or than header + payload, has bytes after the payload,
   a wrong magic, an older or newer version, a header checksum that does not
   match, another kind, another namespace, another key, other dims, or a
   payload checksum that does not match. The caller deletes a refused file
   and recomputes its blocks (disk.py rule 5).
2. xxh3 (the `xxhash` package): a checksum against accidents, not against an
   adversary (the cache directory is the user's own). blake2b ran at
   ~250 MB/s here against xxh3's ~30 GB/s, and every restored block is
   checked: a 6,000-token prompt of a 135M model is ~276 MB of float32 K/V.
3. The format version changes whenever the layout above or the meaning of a
   payload byte changes; an older file is then refused like a corrupt one
   (version 1 had no kind and held float blocks only).

No MLX here: the payload is bytes (diskparts.py turns arrays into them and back).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

MAGIC = b"FRKVBLK\0"
FORMAT_VERSION = 2
KIND_BLOCK, KIND_WINDOW, KIND_STATE = 1, 2, 3
_HEAD = struct.Struct("<8sHH16s16s6I16sQ16s")  # everything before the header checksum
_CHECK = struct.Struct("<Q")
HEADER_NBYTES = _HEAD.size + _CHECK.size


class BadBlockFile(Exception):
    """A block file that must not be loaded (rule 1); the message says why."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """What one kind of file of one engine holds; every such file it reads must say the same."""

    namespace: bytes            # 16 bytes: the engine's digest (diskparts.py rule 1)
    kind: int                   # KIND_*
    dims: tuple[int, ...]       # six u32 (module layout)
    dtype: str                  # at most 16 ASCII characters
    payload_nbytes: int

    @property
    def file_nbytes(self) -> int:
        return HEADER_NBYTES + self.payload_nbytes


def encode_header(layout: BlockLayout, key: int, payload: bytes | memoryview) -> bytes:
    """The header for `payload`, the bytes of the file named `key`."""
    if len(payload) != layout.payload_nbytes:
        raise ValueError(f"payload of {len(payload)} bytes; the layout needs {layout.payload_nbytes}")
    head = _HEAD.pack(
        MAGIC, FORMAT_VERSION, layout.kind, layout.namespace, key.to_bytes(16, "little"),
        *layout.dims, layout.dtype.encode("ascii"), len(payload),
        xxhash.xxh3_128_digest(payload))
    return head + _CHECK.pack(xxhash.xxh3_64_intdigest(head))


def decode(layout: BlockLayout, key: int, data: bytes | memoryview) -> memoryview:
    """The payload of a whole file's bytes `data`, checked against rule 1."""
    view = memoryview(data)
    if len(view) < HEADER_NBYTES:
        raise BadBlockFile(f"truncated header ({len(view)} of {HEADER_NBYTES} bytes)")
    head = view[:_HEAD.size]
    magic, version, kind, namespace, key_bytes, *rest = _HEAD.unpack(head)
    dims, (dtype, nbytes, checksum) = tuple(rest[:6]), rest[6:]
    if magic != MAGIC:
        raise BadBlockFile("not a frink-mlx KV block file (magic)")
    if version != FORMAT_VERSION:
        raise BadBlockFile(f"format version {version}, this build reads {FORMAT_VERSION}")
    (header_check,) = _CHECK.unpack(view[_HEAD.size:HEADER_NBYTES])
    if header_check != xxhash.xxh3_64_intdigest(head):
        raise BadBlockFile("header checksum mismatch")
    if kind != layout.kind:
        raise BadBlockFile(f"a file of kind {kind}, expected {layout.kind}")
    if namespace != layout.namespace:
        raise BadBlockFile("written for another model, dtype or layer layout (namespace)")
    if key_bytes != key.to_bytes(16, "little"):
        raise BadBlockFile("holds another block (hash)")
    found = (dims, dtype.rstrip(b"\0").decode("ascii"))
    if found != (tuple(layout.dims), layout.dtype) or nbytes != layout.payload_nbytes:
        raise BadBlockFile(f"layout {found} ({nbytes} bytes), expected "
                           f"{(tuple(layout.dims), layout.dtype)}")
    payload = view[HEADER_NBYTES:]
    if len(payload) != nbytes:
        raise BadBlockFile(f"payload of {len(payload)} bytes, the header says {nbytes}")
    if xxhash.xxh3_128_digest(payload) != checksum:
        raise BadBlockFile("payload checksum mismatch")
    return payload
