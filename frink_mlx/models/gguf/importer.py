"""`import_gguf`: a GGUF file -> a cached MLX checkpoint dir, one tensor (slice) at a time.

Why streaming: a GGUF is mostly weights; loading them all, dequantized, would need
several times the file's size in RAM. We read each tensor in slices of rows
(`CHUNK_ELEMENTS` weights), convert the slice, and flush converted tensors into
safetensors shards of `SHARD_BYTES`, so peak memory is about one shard plus one
slice, whatever the model's size.

Algorithm:
  1. read and validate the header; refuse every unsupported tensor type at once
  2. build the mlx-lm config (arch.py) and map every GGUF tensor to a parameter
  3. tokenizer.json / tokenizer_config.json from the metadata (tokenizer.py)
  4. for each tensor: for each slice of rows: dequantize with the gguf package,
     then keep it as float or re-express it as MLX affine groups (tensors.py);
     and apply the parameter's plan: stacked sources, row and column orders,
     value maps (plan.py; arch.py rules 1, 2 and the families' quirks)
  5. write everything into a temp dir beside the target and rename it into
     place, so a crash never leaves a half-written checkpoint that looks valid.
Progress goes to the `progress` callback (the CLI draws a bar from it) and to
the log (phase times; one line per ~10% of the tensor bytes).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from . import arch as archs
from . import tensors as tx
from .cache import ImportProgress, ProgressFn, checkpoint_dir_for
from .plan import Plan, move_col_blocks, take_rows
from .reader import GGUFHeader, TensorInfo, read_header
from .tokenizer import build_tokenizer_files

log = logging.getLogger("frink_mlx.gguf")

CHUNK_ELEMENTS = 1 << 24  # weights dequantized at once (64 MiB as float32)
SHARD_BYTES = 1 << 29  # 512 MiB: the bound on converted weights held at once


def import_gguf(path: str | Path, cache_dir: str | Path, *, as_float: bool = False,
                progress: ProgressFn | None = None) -> Path:
    """Convert a GGUF (any file name, e.g. an Ollama blob) into a cached MLX checkpoint dir.

    `as_float` stores every quantized tensor dequantized to float32 (a separate cache entry)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"GGUF file not found: {path}")
    started = time.perf_counter()
    try:
        header = read_header(path, tx.type_sizes())
        _refuse_unsupported(header)
        target = checkpoint_dir_for(path, cache_dir, as_float=as_float, progress=progress)
        log.info("hashed %s (%.2f GB) in %.1f s", path.name, header.file_size / 1e9,
                 time.perf_counter() - started)
        if (target / "config.json").is_file():
            return target
        job = _Import(header, as_float, progress)
        log.info("importing %s: %s, %d tensors (%s)", path.name, job.arch, len(job.names),
                 ", ".join(sorted({tx.type_name(i.ggml_type) for i in header.tensors.values()})))
        job.write(target)
    except ModelFormatError as exc:
        prefix = f"{path}: "
        message = exc.message if exc.message.startswith(prefix) else prefix + exc.message
        raise ModelFormatError(message) from None
    log.info("imported %s in %.1f s -> %s", path.name, time.perf_counter() - started, target)
    return target


def check_gguf(path: str | Path) -> str:
    """What `import_gguf` checks before converting (header, tensor types, architecture),
    without hashing or converting; the architecture, or ModelFormatError naming the file.
    `frink-mlx models` marks entries it would refuse with this."""
    path = Path(path)
    try:
        header = read_header(path, tx.type_sizes())
        _refuse_unsupported(header)
        return archs.arch_spec(header.metadata)[0]
    except ModelFormatError as exc:
        prefix = f"{path}: "
        message = exc.message if exc.message.startswith(prefix) else prefix + exc.message
        raise ModelFormatError(message) from None


def _refuse_unsupported(header: GGUFHeader) -> None:
    """Every unsupported tensor type in the file, with counts and what to do, in one line."""
    supported = tx.supported_types()
    bad: dict[str, list[str]] = {}
    for info in header.tensors.values():
        if info.ggml_type not in supported:
            bad.setdefault(tx.type_name(info.ggml_type), []).append(info.name)
    if not bad:
        for info in header.tensors.values():
            if info.row_elements % info.block_elements:
                raise ModelFormatError(f"corrupt GGUF (tensor {info.name}: rows of {info.row_elements} "
                                       f"weights are not whole {tx.type_name(info.ggml_type)} blocks)")
        return
    listed = "; ".join(f"{t} ({len(names)} tensors, e.g. {names[0]})" for t, names in sorted(bad.items()))
    raise ModelFormatError(
        f"unsupported GGUF tensor types: {listed}. "
        f"frink-mlx imports {', '.join(sorted(supported.values()))}; "
        "re-quantize the original model to one of these (e.g. llama.cpp's llama-quantize ... Q4_K_M) "
        "or use an MLX checkpoint")


class _Import:
    def __init__(self, header: GGUFHeader, as_float: bool, progress: ProgressFn | None) -> None:
        self.header, self.as_float, self.progress = header, as_float, progress
        meta = header.metadata
        self.arch, self.spec = archs.arch_spec(meta)
        names = set(header.tensors)
        embed = header.tensors.get("token_embd.weight")
        if embed is None:
            raise ModelFormatError("GGUF has no token_embd.weight tensor")
        rope = {n: self._float_tensor(header.tensors[n]).reshape(-1)
                for n in archs.ROPE_TENSORS if n in names}
        self.config = archs.build_config(meta, self.arch, self.spec, names, embed.shape[0], rope)
        self.layout = archs.model_layout(self.config)
        weight_names = [n for n in header.tensors
                        if n not in archs.ROPE_TENSORS and not n.startswith(archs.MULTIMODAL_PREFIXES)]
        if len(weight_names) + len(rope) < len(header.tensors):
            log.info("ignoring %d vision/projector tensors (text only)",
                     len(header.tensors) - len(weight_names) - len(rope))
        self.plans = archs.plans_for(self.spec, self.config, weight_names, self.layout)
        missing = archs.missing_params(self.plans, self.layout, self.config["tie_word_embeddings"])
        if missing:
            raise ModelFormatError(f"GGUF lacks tensors the {self.spec.model_type} model needs: "
                                   f"{', '.join(missing[:6])}")
        self.names = [n for plan in self.plans.values() for n in plan.sources]
        self.quant: dict[str, dict[str, int]] = {}

    def _float_tensor(self, info: TensorInfo) -> np.ndarray:
        raw = self.header.read_rows(info, 0, info.rows)
        return tx.dequantize(raw, info.ggml_type, info.row_elements)

    def write(self, target: Path) -> None:
        import mlx.core as mx

        started = time.perf_counter()
        tok_json, tok_config = build_tokenizer_files(self.header.metadata)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            shards = self._convert_all(tmp, mx)
            self._finish_config(shards)
            (tmp / "tokenizer.json").write_text(tok_json, encoding="utf-8")
            (tmp / "tokenizer_config.json").write_text(
                json.dumps(tok_config, indent=2, ensure_ascii=False), encoding="utf-8")
            (tmp / "config.json").write_text(json.dumps(self.config, indent=2))
            try:
                os.rename(tmp, target)
            except OSError:
                if not (target / "config.json").is_file():  # lost a race to a finished writer: fine
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("converted %d tensors (%s, %s) in %.1f s", len(self.names), self.arch,
                 "float32" if self.as_float else "MLX affine", time.perf_counter() - started)

    def _convert_all(self, tmp: Path, mx: Any) -> int:
        """Step 4, flushing shards of about SHARD_BYTES; returns the number of shards written.

        A shard is flushed before a tensor that would push it past the limit (its
        converted size estimated at twice its GGUF bytes), so at most one shard's worth
        of converted weights and one tensor in conversion are held at once."""
        total = sum(self.header.tensors[n].nbytes for n in self.names) or 1
        done, shard_bytes, num_shards, next_log = 0, 0, 0, 0.1
        shard: dict[str, Any] = {}

        def flush() -> None:
            nonlocal shard, shard_bytes, num_shards
            num_shards += 1
            mx.save_safetensors(str(tmp / f"model-{num_shards:05d}.safetensors"), shard,
                                metadata={"format": "mlx"})
            shard, shard_bytes = {}, 0

        for hf, plan in self.plans.items():
            nbytes = sum(self.header.tensors[n].nbytes for n in plan.sources)
            if shard and shard_bytes + 2 * nbytes > SHARD_BYTES:
                flush()
            for key, value in self._convert(plan, hf, mx).items():
                shard[key] = value
                shard_bytes += value.nbytes
            done += nbytes
            self._report("convert", done, total, plan.sources[0])
            if done / total >= next_log or done == total:
                log.info("converting: %d%% (%s)", int(100 * done / total), plan.sources[0])
                next_log = done / total + 0.1
        if shard or not num_shards:
            flush()
        if num_shards == 1:
            os.rename(tmp / "model-00001.safetensors", tmp / "model.safetensors")
        return num_shards

    def _report(self, phase: str, done: int, total: int, tensor: str = "") -> None:
        if self.progress is not None:
            self.progress(ImportProgress(phase, done, total, tensor))

    def _convert(self, plan: Plan, hf: str, mx: Any) -> dict[str, Any]:
        """One parameter from its plan (plan.py rules 1-5)."""
        module, _, leaf = hf.rpartition(".")
        expected = self.layout.shapes[hf]
        infos = [self.header.tensors[n] for n in plan.sources]
        self._check_shape(plan, infos, expected)
        quantizable = (leaf == "weight" and module in self.layout.quantizable and len(expected) >= 2
                       and plan.values is None)
        targets, requant = self._targets(plan, infos, quantizable)
        parts = [self._convert_tensor(info, target, mx) for info, target in zip(infos, targets)]
        arrays = [np.concatenate(group) if len(group) > 1 else group[0] for group in zip(*parts)]
        if plan.rows is not None:
            arrays = [take_rows(a, plan.rows) for a in arrays]
        if plan.col_blocks is not None:
            arrays = self._move_columns(arrays, plan.col_blocks, targets[0])
        if requant is not None:
            weight, scales, biases = mx.quantize(mx.array(arrays[0]), group_size=tx.GROUP_SIZE, bits=requant)
            dtype = tx._scale_dtype(np.array(scales), np.array(biases))
            arrays, targets = [np.array(weight), np.array(scales).astype(dtype),
                               np.array(biases).astype(dtype)], [tx.Target(requant)]
        if targets[0].quantized:
            self.quant[module] = {"group_size": tx.GROUP_SIZE, "bits": int(targets[0].bits or 0)}
            weight, scales, biases = (a.reshape(*expected[:-1], a.shape[-1]) for a in arrays)
            return {f"{module}.weight": mx.array(weight), f"{module}.scales": mx.array(scales),
                    f"{module}.biases": mx.array(biases)}
        value = arrays[0].reshape(expected)
        if targets[0].dtype == "bfloat16":
            return {hf: mx.array(value).view(mx.bfloat16)}
        if plan.values is not None:
            value = plan.values(value.astype(np.float32))
        return {hf: mx.array(value)}

    def _targets(self, plan: Plan, infos: list[TensorInfo],
                 quantizable: bool) -> tuple[list[tx.Target], int | None]:
        """Each source's target, and the bits to re-quantize the stacked float rows at when
        the sources would not agree (plan.py rules 1, 3, 4)."""
        as_float = self.as_float or plan.values is not None
        targets = [tx.target_for(i.ggml_type, quantizable=quantizable, as_float=as_float) for i in infos]
        bits = {t.bits for t in targets}
        aligned = plan.col_blocks is None or plan.col_blocks[0] % tx.GROUP_SIZE == 0
        if any(t.quantized for t in targets) and (len(bits) > 1 or not aligned):
            return [tx.Target(None)] * len(infos), (max(b or 0 for b in bits) if aligned else None)
        if len({t.dtype for t in targets}) > 1:
            return [tx.Target(None)] * len(infos), None
        return targets, None

    def _check_shape(self, plan: Plan, infos: list[TensorInfo], expected: tuple[int, ...]) -> None:
        """plan.py rule 5; stacked sources and row subsets compare as (rows, row length)."""
        rows, width = sum(i.rows for i in infos), infos[0].row_elements
        flattened = len(infos) > 1 or (plan.rows is not None and rows > 1 and plan.rows.size != rows)
        shape = [rows if plan.rows is None else plan.rows.size, width] if flattened else list(infos[0].shape)
        if tuple(shape) == expected:
            return
        if flattened and (width != expected[-1] or any(i.row_elements != width for i in infos)):
            pass
        elif (plan.reshape or flattened) and int(np.prod(shape)) == int(np.prod(expected)):
            return
        raise ModelFormatError(f"tensor {'+'.join(plan.sources)} has shape {shape}, "
                               f"the {self.spec.model_type} model expects {list(expected)}")

    def _convert_tensor(self, info: TensorInfo, target: tx.Target, mx: Any) -> list[np.ndarray]:
        """Step 4 for one GGUF tensor: its rows in slices, into preallocated 2-D outputs."""
        step = max(1, CHUNK_ELEMENTS // info.row_elements)
        arrays: list[np.ndarray] = []
        for start in range(0, info.rows, step):  # slices fill preallocated outputs: no concatenation
            stop = min(start + step, info.rows)
            part = self._convert_rows(info, target, start, stop, mx)
            if not arrays:
                arrays = [np.empty((info.rows, *p.shape[1:]), dtype=p.dtype) for p in part]
            for out, piece in zip(arrays, part):
                out[start:stop] = piece
        return arrays

    @staticmethod
    def _move_columns(arrays: list[np.ndarray], blocks: tuple[int, np.ndarray],
                      target: tx.Target) -> list[np.ndarray]:
        """plan.py rule 3: a quantized block of `width` weights is width*bits/32 words and
        width/32 scales and biases."""
        width, order = blocks
        if not target.quantized:
            return [move_col_blocks(arrays[0], width, order)]
        words = width * int(target.bits or 0) // 32
        groups = width // tx.GROUP_SIZE
        return [move_col_blocks(arrays[0], words, order),
                *(move_col_blocks(a, groups, order) for a in arrays[1:])]

    def _convert_rows(self, info: TensorInfo, target: tx.Target, start: int, stop: int,
                      mx: Any) -> tuple[np.ndarray, ...]:
        raw = self.header.read_rows(info, start, stop)
        if not target.quantized:
            return (tx.float_rows(raw, info.ggml_type, info.row_elements, target.dtype),)
        reference = tx.dequantize(raw, info.ggml_type, info.row_elements)
        if target.exact:
            return tx.exact_affine(raw, info.ggml_type, info.row_elements, int(target.bits), reference)  # type: ignore[arg-type]
        weight, scales, biases = mx.quantize(mx.array(reference), group_size=tx.GROUP_SIZE, bits=target.bits)
        scales_np, biases_np = np.array(scales), np.array(biases)
        dtype = tx._scale_dtype(scales_np, biases_np)
        return np.array(weight), scales_np.astype(dtype), biases_np.astype(dtype)

    def _finish_config(self, num_shards: int) -> None:
        types = sorted({tx.type_name(self.header.tensors[n].ggml_type) for n in self.names})
        if self.quant:
            first = next(iter(self.quant.values()))
            self.config["quantization"] = {**first, **self.quant}
        self.config["gguf"] = {"file": self.header.path.name, "tensor_types": types,
                               "as_float": self.as_float, "shards": num_shards}
