"""GGUF import: wall time and peak RSS for a ~1B-parameter llama GGUF (Llama-3.2-1B's shape).

Why: the importer streams tensor slices into bounded shards (models/gguf/importer.py);
this measures what that buys on a real-sized model. The `gguf` package cannot
quantize K-quants, so the file holds random raw blocks (scale fields set so the
weights are ~N(0, 0.02)); the import does the same work as on a real file.

    .venv/bin/python benchmarks/gguf_import_bench.py                  # Q4_K everywhere
    .venv/bin/python benchmarks/gguf_import_bench.py --mix q4_k_m     # attn_v/ffn_down/token_embd Q6_K
    options: --dir /tmp/frink-gguf-bench (reused between runs), --layers 16, --float

Prints: the GGUF's size and parameter count, then for a cold import (a fresh
process, empty cache) and a warm one (cache hit: hash only) the wall time and
the child's peak RSS (ru_maxrss), and the checkpoint's size on disk.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"hidden": 2048, "ffn": 8192, "heads": 32, "kv_heads": 8, "vocab": 128256}
SCALE_OFFSETS = {"Q4_K": (0, 2), "Q6_K": (208,)}  # byte offsets of the f16 d (and dmin) fields


def tensor_plan(layers: int, mix: str) -> list[tuple[str, tuple[int, int], str]]:
    h, f, hd = SHAPE["hidden"], SHAPE["ffn"], SHAPE["hidden"] // SHAPE["heads"]
    q6 = mix == "q4_k_m"
    plan = [("token_embd.weight", (SHAPE["vocab"], h), "Q6_K" if q6 else "Q4_K")]
    for i in range(layers):
        plan += [(f"blk.{i}.attn_q.weight", (h, h), "Q4_K"),
                 (f"blk.{i}.attn_k.weight", (SHAPE["kv_heads"] * hd, h), "Q4_K"),
                 (f"blk.{i}.attn_v.weight", (SHAPE["kv_heads"] * hd, h), "Q6_K" if q6 else "Q4_K"),
                 (f"blk.{i}.attn_output.weight", (h, h), "Q4_K"),
                 (f"blk.{i}.ffn_gate.weight", (f, h), "Q4_K"),
                 (f"blk.{i}.ffn_up.weight", (f, h), "Q4_K"),
                 (f"blk.{i}.ffn_down.weight", (h, f), "Q6_K" if q6 else "Q4_K"),
                 (f"blk.{i}.attn_norm.weight", (h,), "F32"),
                 (f"blk.{i}.ffn_norm.weight", (h,), "F32")]
    return plan + [("output_norm.weight", (h,), "F32")]


def random_tensor(shape: tuple[int, ...], qname: str, rng: np.random.Generator) -> np.ndarray:
    import gguf

    if qname == "F32":
        return np.ones(shape, dtype=np.float32)
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qname]]
    blocks = rng.integers(0, 256, size=(shape[0] * shape[1] // block, nbytes), dtype=np.uint8)
    d = np.array([2e-5 if qname == "Q4_K" else 5e-6], dtype=np.float16).view(np.uint8)
    for at in SCALE_OFFSETS[qname]:
        blocks[:, at:at + 2] = d
    return blocks.reshape(shape[0], shape[1] // block * nbytes)


def write_gguf(path: Path, layers: int, mix: str) -> int:
    """Stream a random GGUF to `path` (one tensor in memory at a time); returns parameters."""
    import gguf

    h = SHAPE["hidden"]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for add, value in ((writer.add_context_length, 131072), (writer.add_embedding_length, h),
                       (writer.add_block_count, layers), (writer.add_feed_forward_length, SHAPE["ffn"]),
                       (writer.add_head_count, SHAPE["heads"]), (writer.add_head_count_kv, SHAPE["kv_heads"]),
                       (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_rope_freq_base, 500000.0)):
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list([f"tok{i}" for i in range(SHAPE["vocab"])])
    writer.add_token_merges([])
    writer.add_token_types([1] * SHAPE["vocab"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    plan = tensor_plan(layers, mix)
    for name, shape, qname in plan:
        if qname == "F32":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
        else:
            qtype = gguf.GGMLQuantizationType[qname]
            block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
            byte_shape = (shape[0], shape[1] // block * nbytes)  # the writer wants raw types' byte shape
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1], qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for _, shape, qname in plan:
        writer.write_tensor_data(random_tensor(shape, qname, rng))
    writer.close()
    return sum(int(np.prod(shape)) for _, shape, _ in plan)


CHILD = """
import json, resource, sys, time
from frink_mlx.models.gguf import import_gguf
started = time.perf_counter()
target = import_gguf(sys.argv[1], sys.argv[2], as_float=sys.argv[3] == "1")
print(json.dumps({"wall_s": time.perf_counter() - started, "target": str(target),
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def timed_import(path: Path, cache: Path, as_float: bool) -> dict:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(cache), "1" if as_float else "0"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/frink-gguf-bench")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--mix", choices=["q4_k", "q4_k_m"], default="q4_k")
    parser.add_argument("--float", dest="as_float", action="store_true")
    args = parser.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"llama-1b-{args.mix}-{args.layers}l.gguf"
    started = time.perf_counter()
    params = sum(int(np.prod(s)) for _, s, _ in tensor_plan(args.layers, args.mix))
    if not path.is_file():
        write_gguf(path, args.layers, args.mix)
        print(f"wrote {path} in {time.perf_counter() - started:.1f} s")
    print(f"gguf: {path.stat().st_size / 1e9:.2f} GB, {params / 1e9:.2f} B parameters, mix {args.mix}, "
          f"{'float32' if args.as_float else 'MLX affine'} import")
    cache = root / "cache"
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    for label in ("cold import", "warm (cache hit)"):
        r = timed_import(path, cache, args.as_float)
        print(f"{label:18s} wall {r['wall_s']:6.1f} s (process {r['process_s']:5.1f} s)  "
              f"peak RSS {r['maxrss_kb'] / 1024:7.0f} MiB")
    target = Path(r["target"])
    size = sum(p.stat().st_size for p in target.iterdir())
    shards = len(list(target.glob("*.safetensors")))
    print(f"checkpoint: {size / 1e9:.2f} GB in {shards} shard(s) -> {target}")
    print(f"(this process: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
