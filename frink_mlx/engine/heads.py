"""Logits of chosen positions only: the model body, then the LM head on a few rows.

Why: the (positions, vocab) matmul of the LM head is the largest single one
of a forward; a prefill chunk samples one position, a verify row 1 + k, so
for the model families we know how to split (head(body(x))) the head runs
on the rows that are sampled and nothing else. The target's runner
(runner.py) and the draft model's (engine/speculative/model.py) both use it.
`in_groups` runs a recurrent model's rows in calls of one length each (never
padded, kv/recurrent.py rule 4) and puts their logit rows back in order.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mlx.core as mx

_SPLITTABLE = {"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3"}


def pick(values: mx.array, finals: list[tuple[int, int, int]]) -> mx.array:
    """values[(row, pos)] for each final chunk, repeated once per sampled row."""
    rows = [r for r, _, n in finals for _ in range(n)]
    cols = [c for _, c, n in finals for _ in range(n)]
    return values[mx.array(rows), mx.array(cols)]


def pick_all(values: mx.array, spans: list[tuple[int, int, int]]) -> mx.array:
    """values[(row, 0..last)] for each (row, last, _) span, in order: verify positions."""
    rows = [r for r, last, _ in spans for _ in range(last + 1)]
    cols = [c for _, last, _ in spans for c in range(last + 1)]
    return values[mx.array(rows), mx.array(cols)]


def split_head(model: Any) -> tuple[Callable, Callable] | None:
    """(body, head) for model families whose logits are head(body(x)); else None."""
    kind = type(model).__module__
    inner = getattr(model, "model", None)
    args = getattr(model, "args", None)
    if kind not in _SPLITTABLE or inner is None or args is None:
        return None
    if getattr(args, "tie_word_embeddings", False):
        head = inner.embed_tokens.as_linear
    elif hasattr(model, "lm_head"):
        head = model.lm_head
    else:
        return None
    return (lambda x, caches: inner(x, caches)), head


def in_groups(keys: Sequence[int], counts: Sequence[int],
              run: Callable[[list[int]], mx.array | None]) -> mx.array | None:
    """`run` once per distinct key over the indices with that key (in order); the logit
    rows that come out, `counts[i]` for index i, put back in index order."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    if len(groups) == 1:
        return run(list(range(len(keys))))
    parts, order = [], []
    for members in groups.values():
        logits = run(members)
        if logits is not None:
            parts.append(logits)
            order += [(i, j) for i in members for j in range(counts[i])]
    if not parts:
        return None
    back = sorted(range(len(order)), key=order.__getitem__)
    return mx.concatenate(parts, axis=0)[mx.array(back, dtype=mx.int32)]
