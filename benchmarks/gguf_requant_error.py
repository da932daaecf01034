"""Re-quantization error per GGUF type and MLX bit width: how REQUANT_BITS was chosen.

For each type the `gguf` package dequantizes, 64 x 512 weights are made (the package's
own quantizer on N(0, 0.2) data where it has one, random raw blocks otherwise, as
in tests/models/gguf_archs.py), dequantized with the package, re-quantized with
`mx.quantize` (group 32) at 4/5/6/8 bits, and the relative RMS error of the round
trip printed. The types in tensors.EXACT_BITS convert losslessly instead; their row
shows what a plain re-quantization would have cost. Also printed: the distinct
values per group of 32 in the source (what an affine grid has to hit).

    .venv/bin/python benchmarks/gguf_requant_error.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "models")]
    import gguf
    from gguf_archs import (  # the test suite's random-block writer
        SCALE_FIELDS,
        random_blocks,
    )

    from frink_mlx.models.gguf import tensors as tx

    rng = np.random.default_rng(0)
    shape = (64, 512)
    print(f"{'type':8s} {'levels/32':>9s}  " + "  ".join(f"{b}-bit" for b in (4, 5, 6, 8)) + "   chosen")
    for name in sorted(tx.supported_types().values()):
        if name in ("F32", "F16", "BF16"):
            continue
        qtype = gguf.GGMLQuantizationType[name]
        if name in SCALE_FIELDS or name in ("IQ1_M", "NVFP4"):
            raw = random_blocks(name, shape, rng)
        else:
            try:
                raw = gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32) * 0.2, qtype)
            except NotImplementedError:
                print(f"{name:8s} (no quantizer and no known scale fields: not measured)")
                continue
        ref = tx.dequantize(raw, int(qtype), shape[1])
        rms = float(np.sqrt((ref ** 2).mean()))
        errors = []
        for bits in (4, 5, 6, 8):
            w, s, b = mx.quantize(mx.array(ref), group_size=32, bits=bits)
            s, b = s.astype(mx.float16), b.astype(mx.float16)  # stored as float16, like the importer
            back = np.array(mx.dequantize(w, s, b, group_size=32, bits=bits))
            errors.append(float(np.sqrt(((back - ref) ** 2).mean())) / rms)
        levels = np.mean([len(np.unique(g)) for g in ref.reshape(-1, 32)[:256]])
        exact = name in tx.EXACT_BITS
        chosen = f"exact {tx.EXACT_BITS[name]}" if exact else f"{tx.REQUANT_BITS.get(name, 6)}"
        print(f"{name:8s} {levels:9.1f}  " + "  ".join(f"{e:5.3f}" for e in errors) + f"   {chosen}")


if __name__ == "__main__":
    main()
