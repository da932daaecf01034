"""How steps are formed: the idle prefill budget, the admission window, pipelining on/off."""

from __future__ import annotations

import random
import threading
import time
import types

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.admission import ArrivalForecast
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.scheduler import Scheduler
from frink_mlx.engine.types import SeqRequest
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

GREEDY = SamplingParams(temperature=0)


def _req(rid: str, n_prompt: int, base: int = 10) -> SeqRequest:
    return SeqRequest(rid, list(range(base, base + n_prompt)), GREEDY, 4)


def test_a_step_that_decodes_nobody_spends_the_idle_budget():
    s = Scheduler(KVCacheManager(64, 4), max_batch=8, prefill_chunk_tokens=8, idle_prefill_tokens=20)
    for i in range(3):
        s.add(_req(f"r{i}", 7, base=10 + 10 * i))
    plan = s.schedule()                     # nobody decodes: 20 tokens
    assert not plan.decode
    assert [len(c.token_ids) for c in plan.prefill] == [7, 7, 6]
    s.update(plan.sample_seq_ids, [1] * len(plan.sample_seq_ids))
    s.add(_req("late", 9, base=200))
    plan = s.schedule()                     # two rows decode: back to the chunk budget of 8
    assert [r.seq_id for r in plan.decode] == [1, 2]
    assert [len(c.token_ids) for c in plan.prefill] == [1, 7]


def test_idle_budget_never_below_the_chunk_budget():
    s = Scheduler(KVCacheManager(8, 4), max_batch=4, prefill_chunk_tokens=8, idle_prefill_tokens=2)
    assert s.idle_prefill_tokens == 8
    assert Scheduler(KVCacheManager(8, 4), max_batch=4, prefill_chunk_tokens=8).idle_prefill_tokens == 8


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    return types.SimpleNamespace(model=model, dtype=mx.float32, context_length=2048)


def _engine(tiny, **overrides) -> tuple[Engine, list]:
    cfg = dict(block_size=4, num_blocks=64, max_batch=8, prefill_chunk_tokens=64, batching=True,
               context_ceiling=128, max_queue=64, queue_timeout_s=30.0, generation=1)
    cfg.update(overrides)
    engine = Engine(tiny, resolve_engine_config(EngineConfig(**cfg), tiny, BACKEND), DecodeGate(), BACKEND)
    plans: list = []
    run = engine.runner.run

    def recording_run(plan, samplers, sliced=None):
        plans.append(plan)
        return run(plan, samplers, sliced)

    engine.runner.run = recording_run  # type: ignore[method-assign]
    engine.start()
    return engine, plans


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 380) for _ in range(n)]


def _burst(engine: Engine, gap_s: float) -> list[list[int]]:
    """Four requests submitted gap_s apart from another thread; their tokens."""
    streams = []

    def submit() -> None:
        for i in range(4):
            streams.append(engine.submit(SeqRequest(f"b{i}", _prompt(i, 6), GREEDY, 3)))
            time.sleep(gap_s)

    thread = threading.Thread(target=submit)
    thread.start()
    thread.join()
    return [[o.token_id for o in s] for s in streams]


def test_admission_window_starts_a_burst_as_one_step(tiny):
    engine, plans = _engine(tiny, admission_window_s=0.5)
    try:
        tokens = _burst(engine, gap_s=0.02)
    finally:
        engine.shutdown(1.0)
    assert len(plans[0].prefill) == 4 and not plans[0].decode
    for i, got in enumerate(tokens):
        want = [int(t) for t, _ in generate_step(mx.array(_prompt(i, 6)), tiny.model, max_tokens=3)]
        assert got == want


def test_without_a_window_the_first_arrival_starts_alone(tiny):
    engine, plans = _engine(tiny, admission_window_s=0.0)
    try:
        _burst(engine, gap_s=0.5)
    finally:
        engine.shutdown(1.0)
    assert len(plans[0].prefill) == 1


def test_forecast_expects_the_clients_that_just_finished():
    f = ArrivalForecast(horizon_s=1.0)
    f.arrived(0.0)
    assert f.expecting_more(0.0)             # no history: a cold burst may be starting
    for _ in range(3):
        f.finished(5.0)                      # three clients finished together
    f.arrived(5.01)
    assert f.expecting_more(5.01)            # one of three is back
    f.arrived(5.02)
    f.arrived(5.03)
    assert not f.expecting_more(5.03)        # all three are back: stop waiting
    f.finished(9.0)                          # later, one conversation ends ...
    f.arrived(9.2)
    assert not f.expecting_more(9.2)         # ... and its next turn comes alone
    assert f.expecting_more(20.0)            # history too old: back to the cold rule


def test_a_lone_follow_up_starts_without_the_window(tiny):
    engine, plans = _engine(tiny, admission_window_s=2.0)
    started: list[float] = []
    run = engine.runner.run

    def timed_run(plan, samplers, sliced=None):
        started.append(time.monotonic())
        return run(plan, samplers, sliced)

    engine.runner.run = timed_run  # type: ignore[method-assign]
    try:
        list(engine.submit(SeqRequest("turn1", _prompt(1, 6), GREEDY, 2)))
        sent = time.monotonic()
        list(engine.submit(SeqRequest("turn2", _prompt(2, 6), GREEDY, 2)))
    finally:
        engine.shutdown(1.0)
    first_step_of_turn2 = min(t for t in started if t >= sent)
    assert first_step_of_turn2 - sent < 1.0  # a held window would be >= 2 s


@pytest.mark.parametrize("pipeline", [False, True])
def test_steps_with_first_tokens_are_read_before_the_next_is_planned(tiny, pipeline):
    engine, plans = _engine(tiny, pipeline=pipeline)
    try:
        streams = [engine.submit(SeqRequest(f"p{i}", _prompt(10 + i, 5 + i), GREEDY, 6)) for i in range(3)]
        for s in streams:
            list(s)
    finally:
        engine.shutdown(1.0)
    lazy_inputs = [row for plan in plans for row in plan.decode if row.token_id is None]
    assert bool(lazy_inputs) == pipeline  # pipelined rows take the previous step's lazy token
    # ... except after a step that sampled first tokens: it is read back (TTFT) first
    for prev, nxt in zip(plans, plans[1:]):
        firsts = {i for chunk in prev.prefill for i in chunk.sample_seq_ids}
        assert all(row.token_id is not None for row in nxt.decode if row.seq_id in firsts)


@pytest.mark.parametrize("setting", [None, True, False])
def test_the_daemon_pipelines_decode_steps_only_on_a_gpu_unless_told(tiny_llama_dir, tmp_path, setting):
    from frink_mlx.registry import ModelSpec
    from frink_mlx.serving.generation import build_generation, free_generation
    from frink_mlx.settings import Settings

    assert BACKEND.pipelines_steps() is (mx.default_device().type == mx.DeviceType.gpu)
    settings = Settings(config_dir=str(tmp_path), pipeline=setting, max_kv_pool_bytes=1 << 24)
    gen = build_generation(ModelSpec(name="tiny", source=str(tiny_llama_dir)), settings.hub_config(), 1,
                           DecodeGate(), BACKEND)
    try:
        assert gen.engine.config.pipeline is (BACKEND.pipelines_steps() if setting is None else setting)
    finally:
        free_generation(gen, 5.0)
