"""Decode throughput with a JSON Schema constraint vs without, same prompt, same engine.

What it measures: the cost of structured output on the decode path -- the
per-token llguidance mask, its unpacking and `mx.where`, and the host sync a
constrained row forces (its next mask depends on the token just sampled).
Both runs use the real Engine, greedy decoding and the same chat prompt; the
schema is shaped so the constrained row never finishes early (an array with
`minItems` beyond reach), so both runs decode exactly `--tokens` tokens.
tok/s counts tokens after the first (decode only), best of `--repeat`,
interleaved so both see the same machine load. Also reports the mask work
alone (ms per token) measured on a standalone matcher.

Run with OpenBLAS preloaded on Linux:
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 .venv/bin/python benchmarks/structured_bench.py
Options: --model NAME, --tokens N (default 64), --batch B (rows per run, default 1),
--repeat N (default 3).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from frink_mlx.backend import select_backend
from frink_mlx.core.request import ResponseFormat, SamplingParams
from frink_mlx.core.structured import grammar_for_format
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.constraints import GrammarCompiler
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.loader import load_model
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

GREEDY = SamplingParams(temperature=0)
PROMPT = "List the steps to bake bread, as JSON."
SCHEMA = {
    "type": "object",
    "properties": {"steps": {"type": "array", "minItems": 1000,
                             "items": {"type": "string", "maxLength": 60}}},
    "required": ["steps"], "additionalProperties": False,
}


class HostSynced:
    """A RowConstraint that allows everything: isolates the cost of the host sync
    a constrained row forces (no pipelining) from the cost of the mask itself."""

    error = None

    def allowed_mask(self) -> None:
        return None

    def accept(self, token_id: int) -> bool:
        return True

    def is_done(self) -> bool:
        return False


def decode_tps(engine: Engine, prompt_ids: list[int], num_tokens: int, batch: int,
               compiler: GrammarCompiler | HostSynced | None) -> tuple[float, float]:
    """Aggregate decode tok/s of `batch` identical rows, and process CPU ms per token.

    CPU time per token is the load-independent view: on a shared machine the
    wall clock measures the neighbours as much as the engine.
    """
    cpu0 = time.process_time()
    spec = grammar_for_format(ResponseFormat("json_schema", schema=SCHEMA))
    streams = []
    for i in range(batch):
        rows: Any = None
        if isinstance(compiler, GrammarCompiler):
            rows = compiler.new_constraints(spec, 1)
        elif compiler is not None:
            rows = [compiler]
        streams.append(engine.submit(SeqRequest(
            f"s{i}-{time.monotonic_ns()}", list(prompt_ids), GREEDY, num_tokens,
            stop_token_ids=frozenset(), constraints=rows)))
    firsts, lasts, counts = [0.0] * batch, [0.0] * batch, [0] * batch
    tokens: list[list[int]] = [[] for _ in range(batch)]
    finishes: list[str | None] = [None] * batch

    def consume(i: int) -> None:
        for out in streams[i]:
            now = time.perf_counter()
            if out.token_id is not None:
                tokens[i].append(out.token_id)
                if counts[i] == 0:
                    firsts[i] = now
                counts[i] += 1
                lasts[i] = now
            finishes[i] = out.finish or finishes[i]
            if out.error:
                raise RuntimeError(f"row {i} failed: {out.error}")

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(f != "length" for f in finishes):
        raise RuntimeError(f"a row ended early ({finishes}); the comparison would be unfair")
    cpu_ms = (time.process_time() - cpu0) * 1000 / sum(counts)
    return (sum(counts) - batch) / (max(lasts) - max(firsts)), cpu_ms


def mask_ms_per_token(compiler: GrammarCompiler, tokenizer: Any, text: str) -> float:
    """Mask + unpack time alone, walking `text`'s tokens through a fresh matcher."""
    spec = grammar_for_format(ResponseFormat("json_schema", schema=SCHEMA))
    row = compiler.new_constraints(spec, 1)[0]
    ids = tokenizer.encode(text, add_special_tokens=False)
    start = time.perf_counter()
    for token_id in ids:
        row.allowed_mask()
        if not row.accept(token_id):
            raise RuntimeError(row.error)
    return (time.perf_counter() - start) * 1000 / len(ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    settings = Settings.load()
    spec = load_registry(settings).resolve(args.model)
    backend = select_backend(settings.backend_config())
    loaded = load_model(spec, settings.load_config(), backend)
    tok = loaded.tokenizer
    prompt_ids = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                         add_generation_prompt=True)
    vocab = int(loaded.config.get("vocab_size") or len(tok._tokenizer))
    t0 = time.perf_counter()
    compiler = GrammarCompiler.for_tokenizer(tok, vocab_size=vocab)
    compiler.compile(grammar_for_format(ResponseFormat("json_schema", schema=SCHEMA)))
    print(f"model {spec.name}: tokenizer wrap + first compile {time.perf_counter() - t0:.2f} s")
    text = '{"steps": ["Preheat the oven to 200 degrees.", "Mix flour, water and yeast.", ' \
           '"Knead the dough for ten minutes.", "Let it rise for an hour."'
    print(f"mask work alone: {mask_ms_per_token(compiler, tok, text):.2f} ms/token")

    cfg = EngineConfig(block_size=16, num_blocks=256, max_batch=max(8, args.batch),
                       prefill_chunk_tokens=256, batching=True, context_ceiling=2048,
                       max_queue=64, queue_timeout_s=300.0, generation=1)
    engine = Engine(loaded, resolve_engine_config(cfg, loaded, backend), DecodeGate(), backend)
    engine.start()
    try:
        decode_tps(engine, prompt_ids, 8, 1, compiler)  # warm-up
        kinds: dict[str, GrammarCompiler | HostSynced | None] = {
            "unconstrained": None, "host-synced, no mask": HostSynced(), "json_schema": compiler}
        tps = {k: 0.0 for k in kinds}
        cpu = {k: float("inf") for k in kinds}
        for _ in range(args.repeat):  # interleaved: every kind sees the same machine load
            for kind, how in kinds.items():
                t, c = decode_tps(engine, prompt_ids, args.tokens, args.batch, how)
                tps[kind], cpu[kind] = max(tps[kind], t), min(cpu[kind], c)
        print(f"batch {args.batch}, {args.tokens} tokens/row, best of {args.repeat}:")
        for kind in kinds:
            slower = (1 - tps[kind] / tps["unconstrained"]) * 100
            print(f"  {kind:22s} {tps[kind]:6.1f} tok/s  ({slower:+5.1f}%)"
                  f"   CPU {cpu[kind]:6.1f} ms/token", flush=True)
        print("target: json_schema costs < 10% of unconstrained decode tok/s")
    finally:
        engine.shutdown(5.0)


if __name__ == "__main__":
    main()
