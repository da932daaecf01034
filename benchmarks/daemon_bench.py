"""Single-stream decode speed: the daemon over HTTP streaming vs in-process mlx_lm.

    python benchmarks/daemon_bench.py [--models FILE] [--model NAME] [--tokens 128] [--rounds 2]

Both sides decode the same prompt greedily for exactly `--tokens` tokens (EOS
ignored) on the same weights:
  * mlx_lm: `stream_generate` in this process; its `generation_tps`.
  * daemon: `frink-mlx serve --port 0` in a subprocess (its own interpreter,
    like a real deployment), one streaming /v1/chat/completions request;
    decode tok/s = (completion_tokens - 1) / (time of last chunk - time of first).
The two never run at the same time (the daemon idles while mlx_lm decodes);
rounds alternate between them and the median is reported with the spread
(the machine may be shared). Also printed: the daemon's own per-token work
(detokenize, stops, parse, JSON, SSE) measured without the model -- the part
of any gap that is not the engine. Target: daemon >= 95% of mlx_lm.
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


class MlxLmBaseline:
    """The same registry entry loaded in this process, decoded by mlx_lm itself."""

    def __init__(self, model_name: str | None, models_path: str | None) -> None:
        from frink_mlx.backend import select_backend
        from frink_mlx.models.loader import load_model
        from frink_mlx.registry import load_registry
        from frink_mlx.settings import Settings

        settings = Settings.load(models_path=models_path)
        self.backend = select_backend(settings.backend_config())
        self.loaded = load_model(load_registry(settings).resolve(model_name), settings.load_config(),
                                 self.backend)
        self.tok = self.loaded.tokenizer
        self.tok.eos_token_ids = set()  # decode exactly `tokens` tokens, like ignore_eos
        self.ids = self.tok.apply_chat_template(PROMPT, add_generation_prompt=True)

    def tps(self, tokens: int) -> float:
        from mlx_lm import stream_generate

        last = None
        for last in stream_generate(self.loaded.model, self.tok, self.ids, max_tokens=tokens):
            pass
        assert last is not None and last.generation_tokens == tokens, last
        return float(last.generation_tps)


class EngineInProcess:
    """frink's own engine on the same weights, without HTTP: separates engine speed
    from serving overhead."""

    def __init__(self, baseline: MlxLmBaseline) -> None:
        from frink_mlx.engine.config import resolve_engine_config
        from frink_mlx.engine.engine import Engine, EngineConfig
        from frink_mlx.engine.gate import DecodeGate
        from frink_mlx.models.budget import plan_kv
        from frink_mlx.settings import Settings

        settings = Settings.load()
        plan = plan_kv(baseline.loaded, settings.budget_config(), baseline.backend.memory_budget())
        config = EngineConfig(block_size=plan.block_size, num_blocks=plan.num_blocks,
                              max_batch=settings.max_batch,
                              prefill_chunk_tokens=settings.prefill_chunk_tokens,
                              batching=settings.batching, context_ceiling=plan.context_ceiling,
                              max_queue=settings.max_queue,
                              queue_timeout_s=settings.queue_timeout_s, generation=1)
        config = resolve_engine_config(config, baseline.loaded, baseline.backend)
        self.engine = Engine(baseline.loaded, config, DecodeGate(), baseline.backend)
        self.engine.start()
        self.ids = list(baseline.ids)

    def tps(self, tokens: int) -> float:
        from frink_mlx.core.request import SamplingParams
        from frink_mlx.engine.types import SeqRequest

        seq = SeqRequest(request_id="", prompt_ids=self.ids, sampling=SamplingParams(temperature=0),
                         max_tokens=tokens, cache_prompt=False)
        stamps = [time.perf_counter() for _ in self.engine.submit(seq)]
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])

    def close(self) -> None:
        self.engine.shutdown(5.0)


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


def pipeline_overhead_us(tokenizer, num_tokens: int = 2000) -> float:
    """Daemon-side cost per token, without the model: StepOutput -> OutputPipeline
    (incremental detokenize, stop matching, parsing) -> OpenAI chunk JSON -> SSE text."""
    import asyncio

    from frink_mlx.adapters.openai.frames import chat_frames
    from frink_mlx.core.output import OutputPipeline
    from frink_mlx.core.request import GenRequest, Message
    from frink_mlx.engine.types import StepOutput
    from frink_mlx.serving.handles import markup_of, token_text

    text = "The quick brown fox jumps over the lazy dog, again and again. " * 200
    ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    req = GenRequest(model="m", messages=[Message("user", "hi")], stop=["<never>"])
    pipeline = OutputPipeline(req, markup_of(tokenizer), token_text(tokenizer),
                              prompt_tokens=10, eos_ids=frozenset())

    class Run:
        id, model, generation, created, n = "r", "m", 1, 0, 1

        async def events(self):
            for k, tok in enumerate(ids):
                finish = "length" if k == len(ids) - 1 else None
                for event in pipeline.on_step(StepOutput(0, tok, finish=finish)):
                    yield event

    async def drain() -> int:
        return sum([len(f) async for f in chat_frames(Run(), True, False)])

    started = time.perf_counter()
    asyncio.run(drain())
    return (time.perf_counter() - started) / len(ids) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=None)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    proc, url = start_daemon(args.model, args.models)
    try:
        baseline_model = MlxLmBaseline(args.model, args.models)
        engine = EngineInProcess(baseline_model)
        daemon_tps(url, 8)  # warm the HTTP path
        engine.tps(8)
        pairs, engine_only = [], []
        for _ in range(args.rounds):  # interleaved, so load drift hits all alike
            pairs.append((baseline_model.tps(args.tokens), daemon_tps(url, args.tokens)))
            engine_only.append(engine.tps(args.tokens))
        engine.close()
    finally:
        proc.terminate()
        proc.wait(60)
    overhead_us = pipeline_overhead_us(baseline_model.tok)
    ratios = sorted(d / b for b, d in pairs)
    engine_median = sorted(engine_only)[len(engine_only) // 2]
    baseline = sorted(b for b, _ in pairs)[len(pairs) // 2]
    served = sorted(d for _, d in pairs)[len(pairs) // 2]
    print("rounds (mlx_lm, daemon) tok/s:", ", ".join(f"({b:.2f}, {d:.2f})" for b, d in pairs))
    print(f"mlx_lm stream_generate : {baseline:8.2f} tok/s (median)")
    print(f"frink-mlx daemon (HTTP): {served:8.2f} tok/s (median)")
    print(f"ratio                  : {ratios[len(ratios) // 2] * 100:6.1f}% median of rounds "
          f"(min {ratios[0] * 100:.1f}%, max {ratios[-1] * 100:.1f}%; target >= 95%)")
    print(f"frink engine, no HTTP  : {engine_median:8.2f} tok/s (median; same weights, "
          "in this process)")
    step_us = 1e6 / baseline
    print(f"daemon-side work/token : {overhead_us:8.1f} us (pipeline + chunk JSON + SSE), "
          f"{overhead_us / step_us * 100:.2f}% of one mlx_lm decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
