"""A bounds-checked GGUF header reader that never loads tensor data it is not asked for.

Why our own reader: `mx.load` reads the whole file into memory and knows only a
few tensor types; the `gguf` package's `GGUFReader` maps the whole file and
builds a Python object per vocabulary string. The importer needs the header
(metadata + tensor table) up front, validated with clear errors, and then the
tensors one slice of rows at a time (`read_rows`, plain `pread`s, so nothing
but the current slice is resident).

Rules:
1. Layout (GGUF v2/v3, little-endian): magic, version, tensor count, metadata
   count; metadata key/value pairs; tensor infos (name, dims innermost-first,
   ggml type, offset); padding to `general.alignment` (default 32); tensor data.
2. Metadata values decode to Python scalars and `str`; arrays of numbers become
   numpy arrays (vocab scores, token types), arrays of strings `list[str]`.
3. Every refusal is a `ModelFormatError` naming the file: bad magic, an
   unsupported version, a header that ends early, a tensor past the end of the file.
4. `TensorInfo.shape` is outermost-first (numpy / MLX order), i.e. GGUF's dims
   reversed; `rows` x `row_elements` is the 2-D view every converter works on
   (expert stacks fold their leading axes into rows).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelFormatError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types: id -> (struct format, numpy dtype); 8 = string, 9 = array.
_SCALARS: dict[int, tuple[str, str]] = {
    0: ("<B", "<u1"), 1: ("<b", "<i1"), 2: ("<H", "<u2"), 3: ("<h", "<i2"), 4: ("<I", "<u4"),
    5: ("<i", "<i4"), 6: ("<f", "<f4"), 7: ("<?", "?"), 10: ("<Q", "<u8"), 11: ("<q", "<i8"),
    12: ("<d", "<f8"),
}
_STRING, _ARRAY = 8, 9


@dataclass(slots=True, frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # outermost first (rule 4)
    ggml_type: int
    offset: int  # absolute file offset of the first byte
    nbytes: int
    block_elements: int
    block_bytes: int

    @property
    def row_elements(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        count = 1
        for d in self.shape[:-1]:
            count *= d
        return count

    @property
    def row_bytes(self) -> int:
        return self.row_elements // self.block_elements * self.block_bytes


@dataclass(slots=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    file_size: int

    def read_rows(self, info: TensorInfo, start: int, stop: int) -> np.ndarray:
        """Raw bytes of rows [start, stop) as a (stop - start, row_bytes) uint8 array."""
        count = (stop - start) * info.row_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, count, info.offset + start * info.row_bytes)
        finally:
            os.close(fd)
        if len(data) != count:
            raise ModelFormatError(f"{self.path}: truncated GGUF (tensor {info.name} extends past the end)")
        return np.frombuffer(data, dtype=np.uint8).reshape(stop - start, info.row_bytes)


class _Cursor:
    """Little-endian reads over the mapped header; running off the end is rule 3's refusal."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def _need(self, n: int) -> None:
        if self.pos + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: truncated GGUF (header ends early)")

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def raw_string(self) -> bytes:
        n = self.unpack("<Q")
        self._need(n)
        data = self.buf[self.pos:self.pos + n]
        self.pos += n
        return data

    def string(self) -> str:
        return self.raw_string().decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS:
                dtype = np.dtype(_SCALARS[item_type][1])
                self._need(count * dtype.itemsize)
                array = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * dtype.itemsize
                return array
            return [self.value(item_type) for _ in range(count)]
        raise ModelFormatError(f"{self.path}: corrupt GGUF (metadata value type {vtype})")


def read_header(path: Path, type_sizes: dict[int, tuple[int, int]]) -> GGUFHeader:
    """Parse and validate the header; `type_sizes` maps ggml type -> (block elements, block bytes).
    Tensors of types missing from it get block sizes (1, 0); the importer refuses them."""
    size = path.stat().st_size
    if size < 4:
        raise ModelFormatError(f"{path}: not a GGUF file (bad magic)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != GGUF_MAGIC:
            raise ModelFormatError(f"{path}: not a GGUF file (bad magic)")
        cur = _Cursor(buf, path)
        cur.pos = 4
        version = cur.unpack("<I")
        if version not in (2, 3):
            raise ModelFormatError(f"{path}: unsupported GGUF version {version}")
        num_tensors, num_kv = cur.unpack("<Q"), cur.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.unpack("<I"))
        raw_infos = []
        for _ in range(num_tensors):
            name = cur.string()
            dims = [cur.unpack("<Q") for _ in range(cur.unpack("<I"))]
            raw_infos.append((name, dims, cur.unpack("<I"), cur.unpack("<Q")))
        header_end = cur.pos
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = -(-header_end // alignment) * alignment
    tensors = {}
    for name, dims, ggml_type, offset in raw_infos:
        block_elements, block_bytes = type_sizes.get(ggml_type, (1, 0))
        shape = tuple(reversed(dims)) or (1,)
        count = 1
        for d in dims:
            count *= d
        nbytes = count // block_elements * block_bytes
        if data_start + offset + nbytes > size:
            raise ModelFormatError(f"{path}: truncated GGUF (tensor {name} extends past the end)")
        tensors[name] = TensorInfo(name, shape, ggml_type, data_start + offset, nbytes,
                                   block_elements, block_bytes)
    return GGUFHeader(path, version, metadata, tensors, size)
