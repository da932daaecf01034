"""Single-stream decode speed: the daemon over HTTP streaming vs in-process mlx_lm.

    python benchmarks/daemon_bench.py [--models FILE] [--model NAME] [--tokens 128] [--rounds 2]

Both sides decode the same prompt greedily for exactly `--tokens` tokens (EOS
ignored) on the same weights:
  * mlx_lm: `stream_generate` in this process; its `generation_tps`.
  * daemon: `frink-mlx serve --port 0` in a subprocess (its own interpreter,
    like a real deployment), one streaming /v1/chat/completions request;
    decode tok/s = (completion_tokens - 1) / (time of last chunk - time of first).
The two never run at the same time; each is measured `--rounds` times and the
best round is kept (the machine may be shared). Target: daemon >= 95% of mlx_lm.
Not a timed test: it prints both numbers and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to bake."}]


def mlx_lm_tps(model_name: str | None, models_path: str | None, tokens: int) -> float:
    from mlx_lm import stream_generate

    from frink_mlx.engine.loader import load_model
    from frink_mlx.registry import load_registry
    from frink_mlx.settings import Settings

    settings = Settings.load(models_path=models_path)
    loaded = load_model(load_registry(settings).resolve(model_name), settings)
    tok = loaded.tokenizer
    tok.eos_token_ids = set()  # decode exactly `tokens` tokens, like ignore_eos
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True)
    last = None
    for last in stream_generate(loaded.model, tok, ids, max_tokens=tokens):
        pass
    assert last is not None and last.generation_tokens == tokens, last
    return float(last.generation_tps)


def start_daemon(model_name: str | None, models_path: str | None) -> tuple[subprocess.Popen, str]:
    argv = [sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0", "--log-level", "warning"]
    if models_path:
        argv += ["--models", models_path]
    if model_name:
        argv += ["--model", model_name]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise SystemExit("the daemon did not start")
    return proc, json.loads(line)["url"]


def daemon_tps(url: str, tokens: int) -> float:
    body = {"model": "default", "messages": PROMPT, "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    first = last = None
    completion = 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=None) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                completion = chunk["usage"]["completion_tokens"]
            if any(c["delta"].get("content") for c in chunk["choices"]):
                now = time.perf_counter()
                first = first or now
                last = now
    assert completion == tokens and first is not None and last is not None, completion
    return (completion - 1) / (last - first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    baseline = max(mlx_lm_tps(args.model, args.models, args.tokens) for _ in range(args.rounds))
    proc, url = start_daemon(args.model, args.models)
    try:
        daemon_tps(url, 8)  # warm the HTTP path
        served = max(daemon_tps(url, args.tokens) for _ in range(args.rounds))
    finally:
        proc.terminate()
        proc.wait(60)
    print(f"mlx_lm stream_generate : {baseline:8.2f} tok/s")
    print(f"frink-mlx daemon (HTTP): {served:8.2f} tok/s")
    print(f"ratio                  : {served / baseline * 100:6.1f}%  (target >= 95%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
