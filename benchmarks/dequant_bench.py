"""Decode speed of a dequantized mxfp4 checkpoint on the CPU backend: mlx-lm's own
`dequantize_model` (fp4/fp8 modes come out bfloat16) against the loader's
`dequantize_to_float32` (loader rule 3), on one random llama, alternating.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 .venv/bin/python benchmarks/dequant_bench.py

Prints the weight dtype and batch-1 decode tokens/s of each, per trial.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
from mlx import nn
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import dequantize_model

from frink_mlx.models.loader import dequantize_to_float32

CONFIG = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8,
          "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
          "rms_norm_eps": 1e-5, "vocab_size": 32000, "rope_theta": 10000.0,
          "tie_word_embeddings": True}


def build(mode: str) -> nn.Module:
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(CONFIG))
    nn.quantize(model, mode=mode)
    mx.eval(model.parameters())
    return model


def mlx_lm_dequantize(model: nn.Module) -> None:
    model.set_dtype(mx.float32)
    dequantize_model(model)
    mx.eval(model.parameters())


def decode_tok_s(model: nn.Module, num_tokens: int) -> float:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 33))]), cache=cache))
    token = mx.array([[5]])
    started = time.perf_counter()
    for _ in range(num_tokens):
        mx.eval(model(token, cache=cache))
    return num_tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="mxfp4", help="mxfp4, mxfp8 or nvfp4")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    ways = {"mlx_lm dequantize_model": mlx_lm_dequantize, "dequantize_to_float32": dequantize_to_float32}
    models = {}
    for name, dequantize in ways.items():
        models[name] = build(args.mode)
        dequantize(models[name])
        decode_tok_s(models[name], 4)  # warm-up
    for trial in range(args.trials):
        for name, model in models.items():
            dtype = model.layers[0].mlp.up_proj.weight.dtype
            print(f"trial {trial + 1}  {name:24s} {dtype}  {decode_tok_s(model, args.tokens):6.1f} tok/s")


if __name__ == "__main__":
    main()
