"""The scheduler in integers: FIFO admission, chunk budget, decode, preemption, fork, abort."""

from __future__ import annotations

import ast
from pathlib import Path

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.scheduler import Scheduler
from frink_mlx.engine.types import SeqRequest


def _req(rid: str, n_prompt: int, max_tokens: int = 8, n: int = 1, base: int = 10,
         **kw) -> SeqRequest:
    return SeqRequest(rid, list(range(base, base + n_prompt)), SamplingParams(temperature=0),
                      max_tokens, n=n, **kw)


def _sched(num_blocks=8, block_size=4, max_batch=4, chunk=8, **kw) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, block_size), max_batch=max_batch,
                     prefill_chunk_tokens=chunk, **kw)


def _feed(s: Scheduler, plan, token: int = 1) -> list:
    ids = plan.sample_seq_ids
    return s.update(ids, [token] * len(ids))


def test_scheduler_never_imports_mlx():
    tree = ast.parse(Path("frink_mlx/engine/scheduler.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not any("mlx" in name for name in names)


def test_prefill_is_chunked_and_decode_runs_every_step():
    s = _sched(num_blocks=16, chunk=4)
    s.add(_req("a", 3))
    plan = s.schedule()
    assert [(c.start, len(c.token_ids), c.sample_seq_ids) for c in plan.prefill] == [(0, 3, [1])]
    _feed(s, plan)
    s.add(_req("b", 10))
    plan = s.schedule()  # a decodes while b's first chunk (4 of the budget) prefills
    assert [r.seq_id for r in plan.decode] == [1] and plan.decode[0].position == 3
    assert [(c.seq_id, c.start, len(c.token_ids), c.sample_seq_ids) for c in plan.prefill] == [(2, 0, 4, [])]
    _feed(s, plan)
    plan = s.schedule()
    assert [(c.start, len(c.token_ids)) for c in plan.prefill] == [(4, 4)]
    _feed(s, plan)
    plan = s.schedule()
    assert [(c.start, len(c.token_ids), c.sample_seq_ids) for c in plan.prefill] == [(8, 2, [2])]
    assert plan.sample_seq_ids == [1, 2]


def test_admission_is_strict_fifo():
    s = _sched(num_blocks=4, chunk=16)
    s.add(_req("big", 12, max_tokens=2))   # 3 blocks
    s.add(_req("huge", 15, base=100))      # 4 blocks: cannot fit while big runs
    s.add(_req("tiny", 2, base=200))       # would fit, but must not jump the queue
    plan = s.schedule()
    assert [c.seq_id for c in plan.prefill] == [1]
    assert [g.request.request_id for g in s.waiting] == ["huge", "tiny"]
    _feed(s, plan)
    plan = s.schedule()
    assert [c.seq_id for c in plan.prefill] == [] and [r.seq_id for r in plan.decode] == [1]
    done = _feed(s, plan)
    assert [(f.seq.seq_id, f.reason) for f in done] == [(1, "length")]
    assert s.kv.num_free_blocks == 4
    plan = s.schedule()
    assert [c.seq_id for c in plan.prefill] == [2]


def test_eos_and_abort_free_blocks_at_once():
    s = _sched()
    s.add(_req("a", 5, stop_token_ids=frozenset({2})))
    s.add(_req("b", 5, base=100))
    plan = s.schedule()
    _feed(s, plan)
    assert s.kv.num_free_blocks == 4
    plan = s.schedule()
    done = s.update([1, 2], [2, 7])
    assert [(f.seq.seq_id, f.reason) for f in done] == [(1, "eos")]
    assert s.kv.num_free_blocks == 6
    aborted = s.abort("b")
    assert [f.reason for f in aborted] == ["abort"] and s.kv.num_free_blocks == 8
    assert not s.has_work


def test_out_of_blocks_preempts_newest_and_recomputes():
    s = _sched(num_blocks=3, max_batch=4)
    s.add(_req("old", 4, max_tokens=5))   # 1 block, then 2 (positions 0..7)
    s.add(_req("new", 4, max_tokens=8, base=50))
    plan = s.schedule()
    _feed(s, plan)
    plan = s.schedule()                  # both need a 2nd block: 2 + 2 > 3 -> new is preempted
    assert plan.preempted == [2]
    assert [r.seq_id for r in plan.decode] == [1]
    assert [g.request.request_id for g in s.waiting] == ["new"]
    assert s.seqs[2].token_ids[-1] == 1 and s.seqs[2].num_pending == 0
    chunks = []
    for _ in range(10):
        _feed(s, plan)
        plan = s.schedule()
        chunks += [(c.seq_id, c.start, c.start + len(c.token_ids)) for c in plan.prefill]
    # old ran to its max_tokens first; new came back with prompt + its one output,
    # its first block straight from the prefix cache
    assert chunks == [(2, 4, 5)]
    assert "old" not in [seq.group.request.request_id for seq in s.seqs.values()]
    assert s.num_preemptions == 1


def test_n_rows_prefill_once_then_fork_with_a_block_copy():
    s = _sched(num_blocks=8, max_batch=4)
    s.add(_req("n3", 6, n=3))
    plan = s.schedule()
    assert len(plan.prefill) == 1 and plan.prefill[0].sample_seq_ids == [1, 2, 3]
    t1, t2, t3 = (s.kv.block_table(i) for i in (1, 2, 3))
    assert t2[0] == t1[0] == t3[0] and len({t1[1], t2[1], t3[1]}) == 3  # full block shared
    s.update([1, 2, 3], [4, 5, 6])
    plan = s.schedule()
    assert sorted(plan.copies) == sorted([(t1[1], t2[1], 2), (t1[1], t3[1], 2)])
    assert [(r.seq_id, r.position, r.token_id) for r in plan.decode] == [(1, 6, 4), (2, 6, 5), (3, 6, 6)]


def test_prefix_hit_skips_cached_blocks_and_salt_separates():
    s = _sched(num_blocks=8, chunk=16)
    s.add(_req("a", 9, max_tokens=1))
    _feed(s, s.schedule())
    assert not s.has_work
    s.add(_req("b", 9, max_tokens=1))
    plan = s.schedule()
    assert plan.prefill[0].start == 8 and s.prefix_hit_tokens_total == 8
    _feed(s, plan)
    s.add(_req("c", 9, max_tokens=1, cache_salt="other"))
    assert s.schedule().prefill[0].start == 0
    s.abort("c")
    s.add(_req("d", 9, max_tokens=1, cache_prompt=False))
    assert s.schedule().prefill[0].start == 0


def test_prompt_blocks_are_shared_within_the_same_step():
    s = _sched(num_blocks=8, chunk=32)
    s.add(_req("a", 9, max_tokens=1))
    s.add(_req("b", 10, max_tokens=1))  # same first 9 tokens: 2 full blocks written by a this step
    plan = s.schedule()
    assert [(c.seq_id, c.start) for c in plan.prefill] == [(1, 0), (2, 8)]
    assert s.kv.block_table(2)[:2] == s.kv.block_table(1)[:2]


def test_expired_waiting_requests_leave_the_queue():
    s = _sched(num_blocks=2, chunk=16)
    s.add(_req("runs", 8), now_s=0.0)
    s.add(_req("waits", 8), now_s=0.0)
    s.schedule(now_s=0.0)
    assert s.expire_waiting(5.0, now_s=4.0) == []
    expired = s.expire_waiting(5.0, now_s=10.0)
    assert [g.request.request_id for g in expired] == ["waits"] and not s.waiting


def test_waiting_behind_prefill_budget_is_not_a_shortage():
    """A burst of long prompts on a slow machine is slow, not full: no timeout."""
    s = _sched(num_blocks=64, chunk=8)
    s.add(_req("long", 40), now_s=0.0)
    s.add(_req("next", 8), now_s=0.0)
    s.schedule(now_s=0.0)  # the whole budget goes to "long"'s first chunk
    assert s.blocked_since_s is None
    assert s.expire_waiting(5.0, now_s=100.0) == [] and len(s.waiting) == 1


def test_shortage_clock_counts_from_when_the_head_was_refused():
    s = _sched(num_blocks=2, chunk=16)
    s.add(_req("runs", 7), now_s=0.0)  # its first decode token still fits in block 2
    s.schedule(now_s=0.0)
    s.add(_req("late", 8, base=100), now_s=50.0)
    s.schedule(now_s=50.0)  # refused for lack of blocks from t=50
    assert s.blocked_since_s == 50.0
    assert s.expire_waiting(5.0, now_s=54.0) == []
    assert [g.request.request_id for g in s.expire_waiting(5.0, now_s=56.0)] == ["late"]


def test_batching_off_runs_one_request_at_a_time():
    s = _sched(num_blocks=16, one_request_at_a_time=True)
    s.add(_req("a", 3, max_tokens=2))
    s.add(_req("b", 3, max_tokens=2))
    plan = s.schedule()
    assert [c.seq_id for c in plan.prefill] == [1]
    _feed(s, plan)
    plan = s.schedule()
    assert [c.seq_id for c in plan.prefill] == [] and [r.seq_id for r in plan.decode] == [1]


def test_contended_engine_cuts_its_prefill_to_shared_chunks():
    """Rule 2: alone, a step that decodes nothing spends idle_prefill_tokens; while another
    engine shares the gate (`contended`), every chunk is shared_prefill_tokens."""
    s = _sched(num_blocks=32, chunk=8, idle_prefill_tokens=32, shared_prefill_tokens=4)
    s.add(_req("a", 40))
    plan = s.schedule()
    assert [len(c.token_ids) for c in plan.prefill] == [32]
    _feed(s, plan)
    s.contended = True
    plan = s.schedule()
    assert [(c.start, len(c.token_ids)) for c in plan.prefill] == [(32, 4)]
    _feed(s, plan)
    s.contended = False
    plan = s.schedule()
    assert [(c.start, len(c.token_ids)) for c in plan.prefill] == [(36, 4)]
