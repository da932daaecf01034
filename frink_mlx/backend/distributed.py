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
3. Two ways to split, both the model file's own (mlx-lm):
   - tensor parallel, `model.shard(group)` (`shard_linear`: column-split
     q/k/v/gate/up, row-split o/down with an all-reduce): each rank holds 1/N
     of those weights and 1/N of the KV heads of every layer; every layer
     all-reduces twice per forward, so it needs a fast link, and then makes
     each step faster.
   - pipeline, `model.model.pipeline(group)` (mlx-lm's `PipelineMixin`): each
     rank keeps a contiguous run of layers (rank 0 the last ones, the low
     ranks one more when they do not divide) and only their KV; inside the
     model's forward, rank r receives the hidden state from rank r+1, runs
     its layers, sends to rank r-1, and an all-gather hands every rank the
     final state. Each step crosses every rank in turn, so one stream decodes
     no faster than on one machine; what it buys is room (a model larger than
     one machine) with little on the wire: one hidden state per rank boundary
     and one all-gather per forward, instead of two all-reduces per layer.
   The crossing happens inside the forward, so the followers' replay of the
   step plan (engine/leader.py, engine/follower.py) serves both unchanged,
   and so does each rank's recurrent state: its slice of a tensor-split
   layer's state (its heads), or its own stage's layers' states.
4. Which: `distributed_split` (settings.py) is "tensor", "pipeline" or
   "auto" (tensor where the model allows it, else pipeline), decided by
   `choose_split` before anything is split. Tensor needs `shard` and query
   and KV heads that divide by the group size, and so must a GatedDeltaNet's
   key and value heads (qwen3_5, read from a nested `text_config` too), else
   the shard would silently drop heads; pipeline needs `model.model.pipeline` and at least one layer
   per rank. A model allowing neither is refused by name with both reasons.
   Every rank decides for itself, so a load's commit round compares the
   kinds (`split_code`; serving/distributed.py rule 2): ranks configured
   differently load nothing rather than run mismatched forwards.
5. Trust (backend/trust.py): the secret is read before `init` listens, and
   the group is proven (HMAC challenge-response over the group itself)
   before `init_group` returns, all under the join deadline; a group that
   fails the proof, or does not form in time, is never handed to anyone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import ConfigError, ModelFormatError
from . import trust

DistBackendName = Literal["ring", "jaccl", "mpi", "any"]
ShardKind = Literal["tensor", "pipeline"]
SHARD_KINDS: tuple[ShardKind, ...] = ("tensor", "pipeline")
SplitChoice = Literal["auto", "tensor", "pipeline"]
SPLIT_CHOICES: tuple[SplitChoice, ...] = ("auto", "tensor", "pipeline")


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Where the group's configuration came from (settings.py `distributed_config`)."""

    hostfile: str | None       # MLX hostfile (JSON); None: already in MLX's environment
    rank: int | None           # None: already in MLX's environment (mlx.launch)
    backend: DistBackendName
    split: SplitChoice = "auto"  # rule 4
    secret_file: str = "group_secret"   # rule 5: the shared secret (mode 0600)
    join_timeout_s: float = 60.0        # rule 5: formed and proven within this, or exit


@dataclass(frozen=True, slots=True)
class DistributedGroup:
    """One process's place in the group (rule 1)."""

    group: Any                 # mx.distributed.Group
    rank: int
    size: int
    backend: str
    split: SplitChoice = "auto"  # rule 4
    plan_key: bytes = b""       # rule 5: the session key of the plan channel's MACs

    @property
    def is_leader(self) -> bool:
        """Rank 0 runs HTTP, the hub, the scheduler and the block manager."""
        return self.rank == 0


def init_group(config: GroupConfig) -> DistributedGroup:
    """Join the group (blocking until every rank has connected and proven the secret,
    at most `join_timeout_s`); rules 1-2 and 5."""
    secret_path = Path(config.secret_file).expanduser()
    secret = trust.read_secret(secret_path)
    if config.hostfile is not None:
        if not os.path.isfile(config.hostfile):
            raise ConfigError(f"--distributed: no hostfile at {config.hostfile}")
        os.environ["MLX_HOSTFILE"] = config.hostfile
    if config.rank is not None:
        os.environ["MLX_RANK"] = str(config.rank)
    import mlx.core as mx

    with trust.join_deadline(config.join_timeout_s, config.rank):
        try:
            group = mx.distributed.init(strict=True, backend=config.backend)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot join the distributed group ({config.backend}): "
                              f"{exc}") from None
        if group.size() < 2:
            raise ConfigError("the distributed group has a single rank; the hostfile must "
                              "list two or more")
        try:
            key = trust.prove(group, secret, source=str(secret_path))
        except (RuntimeError, ValueError) as exc:  # a peer left during the proof
            raise ConfigError(f"rank {group.rank()}: the distributed group broke while its "
                              f"ranks proved the secret: {exc}") from None
    return DistributedGroup(group, group.rank(), group.size(), config.backend, config.split,
                            plan_key=key)


def choose_split(model: Any, size: int, choice: SplitChoice = "auto") -> ShardKind:
    """The split `shard_model` makes for `choice` over `size` ranks (rules 3-4); a model
    that allows none is refused by name, with the reason for each kind."""
    why_not = {"tensor": _tensor_refusal(model, size), "pipeline": _pipeline_refusal(model, size)}
    kinds: tuple[ShardKind, ...] = ("tensor", "pipeline") if choice == "auto" else (choice,)
    for kind in kinds:
        if why_not[kind] is None:
            return kind
    reasons = "; ".join(f"{kind} parallel: {why_not[kind]}" for kind in kinds)
    family = type(model).__module__.rsplit(".", 1)[-1]
    raise ModelFormatError(f"model file {family} cannot be split over {size} ranks "
                           f"({reasons})")


def split_code(kind: str | None) -> int:
    """`kind` as an integer for a commit round's gather (rule 4); 0: not split."""
    return SHARD_KINDS.index(kind) + 1 if kind in SHARD_KINDS else 0


def _tensor_refusal(model: Any, size: int) -> str | None:
    if not callable(getattr(model, "shard", None)):
        return "the model file has no `shard`"
    args = _text_args(model)
    heads = args.get("num_attention_heads")
    counts = {"num_attention_heads": heads,
              "num_key_value_heads": args.get("num_key_value_heads") or heads}
    for name in ("linear_num_key_heads", "linear_num_value_heads"):  # GatedDeltaNet (qwen3_5)
        if args.get(name) is not None:
            counts[name] = args[name]
    for name, count in counts.items():
        if count is None or count % size:
            return f"{name}={count} does not divide by the group size {size}"
    return None


def _text_args(model: Any) -> dict[str, Any]:
    """The model's args as a dict, a nested `text_config` (qwen3_5) taking precedence."""
    args = getattr(model, "args", None)
    fields = dict(vars(args)) if args is not None and hasattr(args, "__dict__") else {}
    nested = fields.get("text_config")
    return {**fields, **nested} if isinstance(nested, dict) else fields


def _pipeline_refusal(model: Any, size: int) -> str | None:
    inner = getattr(model, "model", None)
    if not callable(getattr(inner, "pipeline", None)):
        return "the model file has no `pipeline`"
    num_layers = len(getattr(inner, "layers", None) or ())
    if num_layers < size:
        return f"{num_layers} layers cannot give each of {size} ranks one"
    return None


def shard_model(model: Any, group: DistributedGroup) -> ShardKind:
    """Split `model` in place for this rank (rules 3-4); the kind of split made.

    `model` may still be lazy (loaded with `lazy=True`): the evaluation at the
    end materialises only what this rank kept, so a pipeline stage never reads
    another stage's layers from disk."""
    kind = choose_split(model, group.size, group.split)
    if kind == "tensor":
        model.shard(group.group)
    else:
        model.model.pipeline(group.group)
        if len(model.layers) != model.model.end_idx - model.model.start_idx:
            raise ModelFormatError(f"{type(model).__module__}: `layers` does not list only this "
                                   "rank's pipeline layers; its KV cache could not be sized")
    import mlx.core as mx

    # Materialise the slices now, on this thread: only this rank's part stays, and
    # no lazy slice is left on a stream of a thread that will not evaluate it.
    mx.eval(model.parameters())
    return kind
