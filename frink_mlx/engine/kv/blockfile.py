"""One KV block on disk: a self-checking header, then the block's K and V bytes.

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
      10      2   reserved (0)
      12     16   namespace: the digest of the model's content identity, KV dtype
                  and layer layout (`BlockLayout.namespace`)
      28     16   the block's chained hash (hashing.py), 128 bits
      44     20   num_layers, n_kv_heads, head_dim, v_head_dim, block_size (u32 each)
      64     16   KV dtype name, ASCII, NUL-padded ("float32", "bfloat16", ...)
      80      8   payload length in bytes
      88     16   xxh3-128 of the payload
     104      8   xxh3-64 of bytes [0, 104) (the header itself)

    payload: K of every layer, then V of every layer, each layer's slab
             (n_kv_heads, block_size, head_dim) in C order, the dtype's raw bytes

Rules:
1. `decode` refuses (raises `BadBlockFile`, naming why) a file that is shorter
   than its header or than header + payload, has bytes after the payload,
   a wrong magic, an older or newer version, a header checksum that does not
   match, another namespace, another block hash, another layout, or a
   payload checksum that does not match. The caller deletes a refused file
   and recomputes its blocks (disk.py rule 5).
2. xxh3 (the `xxhash` package): a checksum against accidents, not against an
   adversary (the cache directory is the user's own). blake2b ran at
   ~250 MB/s here against xxh3's ~30 GB/s, and every restored block is
   checked: a 6,000-token prompt of a 135M model is ~276 MB of float32 K/V.
3. The format version changes whenever the layout above or the meaning of a
   payload byte changes; an older file is then refused like a corrupt one.

No MLX here: the payload is bytes (spill.py turns arrays into them and back).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import xxhash

MAGIC = b"FRKVBLK\0"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<8sHH16s16s5I16sQ16s")  # everything before the header checksum
_CHECK = struct.Struct("<Q")
HEADER_NBYTES = _HEAD.size + _CHECK.size


class BadBlockFile(Exception):
    """A block file that must not be loaded (rule 1); the message says why."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """What one engine's blocks look like; every file it reads must say the same."""

    namespace: bytes       # 16 bytes: digest of model identity + dtype + layout
    num_layers: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    block_size: int
    dtype: str             # MLX dtype name, e.g. "float32"
    itemsize: int          # bytes per element of that dtype

    @property
    def payload_nbytes(self) -> int:
        per_token = self.n_kv_heads * (self.head_dim + self.v_head_dim) * self.itemsize
        return self.num_layers * self.block_size * per_token

    @property
    def file_nbytes(self) -> int:
        return HEADER_NBYTES + self.payload_nbytes


def encode_header(layout: BlockLayout, block_hash: int, payload: bytes | memoryview) -> bytes:
    """The header for `payload`, the bytes of block `block_hash`."""
    if len(payload) != layout.payload_nbytes:
        raise ValueError(f"payload of {len(payload)} bytes; the layout needs {layout.payload_nbytes}")
    head = _HEAD.pack(
        MAGIC, FORMAT_VERSION, 0, layout.namespace, block_hash.to_bytes(16, "little"),
        layout.num_layers, layout.n_kv_heads, layout.head_dim, layout.v_head_dim,
        layout.block_size, layout.dtype.encode("ascii"), len(payload),
        xxhash.xxh3_128_digest(payload))
    return head + _CHECK.pack(xxhash.xxh3_64_intdigest(head))


def decode(layout: BlockLayout, block_hash: int, data: bytes | memoryview) -> memoryview:
    """The payload of a whole file's bytes `data`, checked against rule 1."""
    view = memoryview(data)
    if len(view) < HEADER_NBYTES:
        raise BadBlockFile(f"truncated header ({len(view)} of {HEADER_NBYTES} bytes)")
    head = view[:_HEAD.size]
    (magic, version, _, namespace, hash_bytes, layers, heads, head_dim, v_head_dim, block_size,
     dtype, nbytes, checksum) = _HEAD.unpack(head)
    if magic != MAGIC:
        raise BadBlockFile("not a frink-mlx KV block file (magic)")
    if version != FORMAT_VERSION:
        raise BadBlockFile(f"format version {version}, this build reads {FORMAT_VERSION}")
    (header_check,) = _CHECK.unpack(view[_HEAD.size:HEADER_NBYTES])
    if header_check != xxhash.xxh3_64_intdigest(head):
        raise BadBlockFile("header checksum mismatch")
    if namespace != layout.namespace:
        raise BadBlockFile("written for another model, dtype or layer layout (namespace)")
    if hash_bytes != block_hash.to_bytes(16, "little"):
        raise BadBlockFile("holds another block (hash)")
    found = (layers, heads, head_dim, v_head_dim, block_size, dtype.rstrip(b"\0").decode("ascii"))
    wanted = (layout.num_layers, layout.n_kv_heads, layout.head_dim, layout.v_head_dim,
              layout.block_size, layout.dtype)
    if found != wanted or nbytes != layout.payload_nbytes:
        raise BadBlockFile(f"layout {found} ({nbytes} bytes), expected {wanted}")
    payload = view[HEADER_NBYTES:]
    if len(payload) != nbytes:
        raise BadBlockFile(f"payload of {len(payload)} bytes, the header says {nbytes}")
    if xxhash.xxh3_128_digest(payload) != checksum:
        raise BadBlockFile("payload checksum mismatch")
    return payload
