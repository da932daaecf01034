"""The distributed group: which rank this process is, of how many, and how a model is split.

Why in the backend: "how many machines hold this model, and which part is
mine" is a device question like "how much memory do I have"; the engine, the
loader and the budget ask this module instead of `mx.distributed` directly,
so the transport stays MLX's own (ring over TCP, JACCL over Thunderbolt RDMA,
MPI) and is chosen in one place.

Rules:
1. A group exists only when asked for: `frink-mlx serve --distributed HOSTFILE
   --rank R`, or a process started by `mlx.launch` (MLX_HOSTFILE / MLX_RANK,
   read by settings.py, the only reader of the environment). Without either,
   `init_group` returns None and nothing distributed happens.
2. MLX's own `mx.distributed.init` reads its configuration from the
   environment; flags given on the command line are exported to it here,
   once, before init (nothing else writes the environment).
3. Sharding is tensor parallel through the model file's own `shard(group)`
   (mlx-lm's `shard_linear`: column-split q/k/v/gate/up, row-split o/down with
   an all-reduce), so each rank holds 1/N of those weights and 1/N of the KV
   heads. A model file without `shard` is refused by name; pipeline splitting
   is not offered (the step plan would have to cross ranks mid-forward).
4. Heads must divide by the group size (query and KV heads alike), else the
   shard would silently drop heads: refused at load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigError, ModelFormatError

DistBackendName = Literal["ring", "jaccl", "mpi", "any"]
ShardKind = Literal["tensor"]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Where the group's configuration came from (settings.py `distributed_config`)."""

    hostfile: str | None       # MLX hostfile (JSON); None: already in MLX's environment
    rank: int | None           # None: already in MLX's environment (mlx.launch)
    backend: DistBackendName


@dataclass(frozen=True, slots=True)
class DistributedGroup:
    """One process's place in the group (rule 1)."""

    group: Any                 # mx.distributed.Group
    rank: int
    size: int
    backend: str

    @property
    def is_leader(self) -> bool:
        """Rank 0 runs HTTP, the hub, the scheduler and the block manager."""
        return self.rank == 0


def init_group(config: GroupConfig) -> DistributedGroup:
    """Join the group (blocking until every rank has connected); rules 1-2."""
    if config.hostfile is not None:
        if not os.path.isfile(config.hostfile):
            raise ConfigError(f"--distributed: no hostfile at {config.hostfile}")
        os.environ["MLX_HOSTFILE"] = config.hostfile
    if config.rank is not None:
        os.environ["MLX_RANK"] = str(config.rank)
    import mlx.core as mx

    try:
        group = mx.distributed.init(strict=True, backend=config.backend)
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot join the distributed group ({config.backend}): {exc}") from None
    if group.size() < 2:
        raise ConfigError("the distributed group has a single rank; the hostfile must list two or more")
    return DistributedGroup(group, group.rank(), group.size(), config.backend)


def shard_model(model: Any, group: DistributedGroup) -> ShardKind:
    """Split `model` in place for this rank (rules 3-4); the kind of split made."""
    if not callable(getattr(model, "shard", None)):
        raise ModelFormatError(
            f"{type(model).__module__} has no tensor-parallel `shard`; it cannot be served "
            "across machines")
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if count is None or count % group.size:
            raise ModelFormatError(
                f"{name}={count} does not divide by the group size {group.size}")
    model.shard(group.group)
    import mlx.core as mx

    # Materialise the slices now, on this thread: only this rank's part stays, and
    # no lazy slice is left on a stream of a thread that will not evaluate it.
    mx.eval(model.parameters())
    return "tensor"
