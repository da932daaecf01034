"""One model over several machines: rank 0's generation factory and a follower's loader.

Why here: a distributed generation is built like any other (serving/
generation.py) plus two agreements with the followers, which only the
composition layer can arrange because it holds both the registry and the
plan channel:

1. Load: rank 0 posts `Load(g, name)` first, so every follower loads its
   shard while rank 0 loads its own (backend/distributed.py splits each,
   tensor or pipeline parallel, rules 3-4 there).
2. Commit: rank 0 posts `Commit(g)` and all ranks `gather` their
   `commit_row` (engine/follower.py: loaded ok, affordable KV blocks, split
   kind, affordable state snapshots, cache kinds). Every rank loaded, split
   the same way and holds the same kinds -> each builds pools of the
   smallest affordable size (the same block ids must exist everywhere), rank
   0 takes the fewest snapshots any rank affords (their ids too must exist
   everywhere) and g goes live; any rank failed or disagrees (its own
   `distributed_split`, pipeline stages of other kinds) -> every rank drops g
   and rank 0's hub keeps the old generation (the swap happens everywhere or
   nowhere).
3. Each rank prices its own memory, measured on the model after its split:
   its weights (tensor: 1/N of every layer's attention and MLP; pipeline: its
   run of layers) and its KV bytes per token (tensor: 1/N of the KV heads;
   pipeline: its layers only) and its recurrent state per slot and snapshot
   (tensor: its heads' slice; pipeline: its layers'), against its own budget
   (models/budget.py), so a model too large for one machine's budget loads on
   two. Either way every rank also holds the embeddings and the LM head whole.
4. Encoders (embeddings side-cars) are not sharded: rank 0 loads them alone.
   `embeddings = "self"` (embedding with the generative model itself) is
   refused by name: its forwards would run on rank 0 alone and issue
   all-reduces no follower answers.

Left out: restarting a lost group from inside the process (the channel
stays lost; the supervisor restarts every rank), and mixing both splits in
one group (tensor within a pair of machines, pipeline across pairs).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from typing import Any

from ..backend import Backend, ForwardScope, no_scope
from ..backend.distributed import DistributedGroup, shard_model, split_code
from ..config import HubConfig
from ..engine.channel import Commit, Load, PlanChannel
from ..engine.config import resolve_engine_config
from ..engine.engine import Engine
from ..engine.follower import Follower, ShardOffer, commit_row, disagreement
from ..errors import ModelFormatError
from ..models.budget import KVPlan, plan_kv
from ..models.loader import LoadedModel, load_model
from ..registry import ModelSpec, Registry
from .generation import SELF, Gate, Generation, GenerationFactory, build_generation, engine_config

log = logging.getLogger("frink_mlx.distributed")


def leader_factory(channel: PlanChannel, group: DistributedGroup) -> GenerationFactory:
    """The hub's generation factory on rank 0 (module rules 1-4)."""
    factory = functools.partial(_build_leader_generation, channel, group)
    factory.shards = getattr(group, "size", 1)  # type: ignore[attr-defined]  # each rank holds 1/size (hub rule 9)
    return factory


def _shard(group: DistributedGroup, model: Any) -> tuple[str, int]:
    return shard_model(model, group), group.size


def _build_leader_generation(channel: PlanChannel, group: DistributedGroup, spec: ModelSpec,
                             config: HubConfig, number: int, gate: Gate,
                             backend: Backend, draft: ModelSpec | None = None) -> Generation:
    if draft is not None:  # the draft's forwards would need a plan of their own per rank
        log.warning("model %r: its draft model %r is not used across machines "
                    "(prompt lookup still speculates)", spec.name, draft.name)
    if spec.kind != "generative":
        return build_generation(spec, config, number, gate, backend)  # rule 4
    if spec.embeddings == SELF:
        raise ModelFormatError(f"model {spec.name!r}: embeddings = \"self\" cannot be served "
                               "across machines; point `embeddings` at an encoder entry")
    with channel.exclusive():
        channel.post(Load(number, spec.name))
    loaded: LoadedModel | None = None
    plan: KVPlan | None = None
    error: Exception | None = None
    try:
        loaded = load_model(spec, config.load, backend, shard=functools.partial(_shard, group))
        plan = plan_kv(loaded, config.budget, backend.memory_budget())
    except Exception as exc:  # noqa: BLE001 - reported at commit, re-raised below
        error = exc
    # rank 0's own row; its forwards are the engine's, so its offer prepares none
    offer = _offer(loaded, plan, no_scope) if loaded and plan else None
    with channel.exclusive(channel.load_timeout_s):
        channel.post(Commit(number))
        rows = channel.gather(commit_row(offer))
    if error is not None:
        raise error
    reason = disagreement(rows)
    if reason is not None or loaded is None or plan is None:
        raise ModelFormatError(f"model {spec.name!r}: {reason}; the previous model keeps "
                               "serving")
    plan = _agreed_plan(plan, rows, loaded)
    # No speculation nor pipelining in a group (engine/config.py rules 1, 3).
    group_config = resolve_engine_config(engine_config(config, plan, number), loaded, backend,
                                         distributed=True)
    engine = Engine(loaded, group_config, gate, backend,  # type: ignore[arg-type]
                    channel=channel)
    engine.start()
    # loaded.spec: with the checkpoint's sampling defaults (models/loader.py rule 7)
    return Generation(number, loaded.spec, loaded, engine, plan, time.monotonic())


def _agreed_plan(plan: KVPlan, rows: list[list[int]], loaded: LoadedModel) -> KVPlan:
    """Rule 2: the fewest blocks and snapshots any rank affords (its `commit_row`)."""
    num_blocks, num_snapshots = min(row[1] for row in rows), min(row[3] for row in rows)
    row_bytes = loaded.cache_spec.state_bytes_per_row if loaded.cache_spec is not None else 0
    return dataclasses.replace(
        plan, num_blocks=num_blocks, num_snapshots=num_snapshots,
        state_bytes=plan.state_bytes - (plan.num_snapshots - num_snapshots) * row_bytes,
        context_ceiling=min(loaded.context_length, num_blocks * plan.block_size))


def _offer(loaded: LoadedModel, plan: KVPlan, forward: ForwardScope) -> ShardOffer:
    """What this rank loaded and affords (rule 3), as the commit round reads it."""
    return ShardOffer(model=loaded.model, dtype=loaded.dtype, forward=forward,
                      num_blocks=plan.num_blocks, block_size=plan.block_size,
                      split=split_code(loaded.parallel), cache_spec=loaded.cache_spec,
                      num_state_slots=plan.num_state_slots, num_snapshots=plan.num_snapshots)


def follower_loader(registry: Registry, config: HubConfig, backend: Backend,
                    group: DistributedGroup) -> Any:
    """`load_shard(name) -> ShardOffer` for engine/follower.py (rules 1 and 3)."""

    def load_shard(name: str) -> ShardOffer:
        spec = registry.resolve(name)
        loaded = load_model(spec, config.load, backend, shard=functools.partial(_shard, group))
        plan = plan_kv(loaded, config.budget, backend.memory_budget())
        return _offer(loaded, plan, backend.prepare_decoder(loaded.model))

    return load_shard


def serve_follower(channel: PlanChannel, group: DistributedGroup, registry: Registry,
                   config: HubConfig, backend: Backend) -> int:
    """Ranks 1..N-1: follow rank 0 until it stops the group (0) or is lost (1).

    Rank 0 gone with its sockets closed: the pending collective raises. Rank 0
    gone silent: the watchdog below exits the process once no message came
    for `silence_s` while this rank was waiting for one (channel.py rule 4).
    """
    follower = Follower(channel, follower_loader(registry, config, backend, group))
    silence_s = 10 * channel.ping_s + 5.0
    threading.Thread(target=_exit_when_silent, args=(channel, silence_s),
                     name="frink-follower-watchdog", daemon=True).start()
    log.info("rank %d of %d following rank 0", group.rank, group.size)
    try:
        follower.run()
    except Exception as exc:  # noqa: BLE001 - the group cannot recover (follower.py)
        log.error("rank %d lost the group: %s", group.rank, exc)
        return 1
    return 0


def _exit_when_silent(channel: PlanChannel, silence_s: float) -> None:
    while True:
        time.sleep(min(1.0, silence_s / 4))
        if channel.waiting_for_s() > silence_s:
            log.error("rank 0 sent nothing for %.0fs; leaving the group", silence_s)
            os._exit(1)
