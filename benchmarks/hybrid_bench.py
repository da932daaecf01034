"""A hybrid model (qwen3_5: GatedDeltaNet + attention) on frink-mlx beside mlx_lm.server (issue 29).

    .venv/bin/python benchmarks/hybrid_bench.py [--clients 8] [--requests 2] [--tokens 48]
                                                [--history-tokens 1000] [--turn-trials 2]

What one run does (server start, clients and clocks are serve_bench.py's, _common.py):
1. Weights: a random qwen3_5 checkpoint written with mlx-lm's own class
   (hidden 512, 12 layers: every 4th full attention, the rest GatedDeltaNet,
   as Qwen3.5 lays them out), fp32, in mlx format with the tests' tiny
   tokenizer (tests/conftest.py `make_tiny_llama`: ChatML template, 384
   tokens), so both servers load the identical directory.
2. Both servers start and warm up; each level runs on frink-mlx, then on
   mlx_lm.server (the machine drifts; one after the other would compare two
   machines).
   a. load: --clients concurrent clients, --requests streaming chats each,
      --tokens output tokens, greedy; aggregate tok/s = completion tokens
      (usage) / wall time. frink-mlx gets `ignore_eos`; replies that ended
      short on mlx_lm.server are counted.
   b. turns: a --history-tokens document + question (its sentences counted
      with this checkpoint's tokenizer: serve_bench's ~30 per sentence is
      SmolLM2's; the tiny tokenizer spells words in pieces), then the same history +
      the answer + a new question; turn-2 TTFT / turn-1 TTFT, median over
      --turn-trials documents. A hybrid has no prefix cache on mlx_lm.server
      (it recomputes every turn); on frink-mlx turn 2 hits only where
      recurrent-state snapshots exist (the prefix cache of a hybrid, issue 29),
      else `cached_tokens` is 0 and turn 2 recomputes too.
3. Targets (issue 29): aggregate at 8 clients >= 1.15x mlx_lm.server's;
   turn-2 TTFT <= 0.2x turn 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parents[1] / "tests")]
from _common import Server, start_frink, start_mlx_lm  # noqa: E402
from serve_bench import document, load_average, measure_level, measure_turns, run_level  # noqa: E402

HIDDEN, LAYERS = 512, 12


def qwen3_5_config(vocab_size: int) -> dict[str, Any]:
    text = dict(model_type="qwen3_5_text", hidden_size=HIDDEN, intermediate_size=3 * HIDDEN,
                num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=2,
                head_dim=64, vocab_size=vocab_size, max_position_embeddings=8192,
                rms_norm_eps=1e-6, tie_word_embeddings=True, linear_num_value_heads=8,
                linear_num_key_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
                linear_conv_kernel_dim=4, full_attention_interval=4,
                bos_token_id=0, eos_token_id=2)
    return dict(model_type="qwen3_5", text_config=text, tie_word_embeddings=True,
                bos_token_id=0, eos_token_id=2)


def write_checkpoint(out: Path) -> Path:
    """Rule 1: the tokenizer from the tests' tiny llama, qwen3_5 weights from mlx-lm's class."""
    import mlx.core as mx
    from conftest import make_tiny_llama
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5

    make_tiny_llama(out)
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    config = qwen3_5_config(vocab)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    mx.random.seed(0)
    weights = {}
    for name, value in tree_flatten(model.parameters()):
        scale = 1.0 if name.endswith("norm.weight") else 0.05
        weights[name] = (mx.ones(value.shape) if scale == 1.0 else
                         mx.random.normal(value.shape) * scale).astype(mx.float32)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def sentence_scale(ckpt: Path) -> float:
    """serve_bench sizes a history as history_tokens // 30 sentences; this factor makes
    `history_tokens` count this checkpoint's tokens instead (step 2b)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    per_sentence = len(tokenizer.encode(document(0, 20))) / 20
    return 30.0 / per_sentence


async def bench(servers: list[Server], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {s.name: {} for s in servers}
    extras = {s.name: ({"ignore_eos": True} if s.name == "frink-mlx" else {}) for s in servers}
    for server in servers:
        await run_level(server, 2, 1, 8, extras[server.name])  # warm-up
    print(f"load: {args.clients} clients x {args.requests} requests x {args.tokens} tokens",
          flush=True)
    for server in servers:
        out[server.name]["level"] = await measure_level(server, args.clients, args,
                                                        extras[server.name]) \
            if "level" in args.phases else None
    print(f"turns: ~{args.history_tokens}-token history, {args.turn_trials} trials", flush=True)
    turn_args = argparse.Namespace(**{**vars(args), "history_tokens": int(
        args.history_tokens * args.sentence_scale)})
    for server in servers:
        out[server.name]["turns"] = await measure_turns(server, turn_args) \
            if "turns" in args.phases else None
    return out


def report(results: dict[str, dict[str, Any]]) -> None:
    frink, mlx = results.get("frink-mlx"), results.get("mlx_lm.server")
    print("\nsummary")
    for name, res in results.items():
        lvl, turns = res["level"], res["turns"]
        if lvl is not None:
            print(f"  {name:14s} aggregate {lvl['agg_tps']:.2f} tok/s")
        if turns is not None:
            cached = [row["cached2"] for row in turns["rows"]]
            print(f"  {name:14s} turn 1 TTFT {turns['t1']:.3f} s, turn 2 {turns['t2']:.3f} s "
                  f"(ratio {turns['ratio']:.3f}, turn-2 cached_tokens {cached})")
    if frink and mlx and frink["level"] and mlx["level"]:
        agg = frink["level"]["agg_tps"] / mlx["level"]["agg_tps"]
        print(f"  target aggregate >= 1.15x mlx_lm.server: {agg:.2f}x "
              f"({'met' if agg >= 1.15 else 'NOT met'})")
    if frink and frink["turns"]:
        r = frink["turns"]["ratio"]
        print(f"  target turn-2 TTFT <= 0.2x turn 1 (frink-mlx): {r:.3f} "
              f"({'met' if r <= 0.2 else 'NOT met'})")
    print(f"  load average at the end: {load_average()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--history-tokens", type=int, default=1000)
    parser.add_argument("--turn-trials", type=int, default=2)
    parser.add_argument("--phases", default="level,turns", help="level, turns or both")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hybrid-bench-") as tmp:
        ckpt = write_checkpoint(Path(tmp) / "qwen3_5-h512-l12")
        args.sentence_scale = sentence_scale(ckpt)
        models = Path(tmp) / "models.toml"
        models.write_text(f'default = "hybrid"\n\n[models.hybrid]\nsource = "{ckpt}"\n'
                          'dequantize = false\n')
        print(f"weights: qwen3_5 random, hidden {HIDDEN}, {LAYERS} layers (every 4th full "
              f"attention), fp32; load average at start {load_average()}", flush=True)
        servers = [start_frink(str(models), "--max-batch", str(args.clients)),
                   start_mlx_lm(str(ckpt))]
        try:
            report(asyncio.run(bench(servers, args)))
        finally:
            for server in servers:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
