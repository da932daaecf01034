"""The resident set: which generations stay loaded, priced against memory.

Why: an editor alternates a completion model, a chat model and an encoder on
every keystroke pause; with one resident model each alternation is a reload
(10-30 s here). Residency is decided by measured bytes, not by a count: every
resident generation reports what it holds (weights + the KV pool it
reserved + a side-car encoder, `measure_nbytes`), and the sum stays within
the device budget less the headroom. This module is the policy only (plain
numbers and generations, no awaits); the hub (hub.py) loads, leases, waits
and frees, asking this module what to evict and when.

    device budget (override, else Backend.memory_budget())
    ├── headroom (memory_headroom_fraction)           never priced out
    └── residents: [ chat 1.1 GB | fim 0.4 GB | enc 0.1 GB | free ... ]
                      LRU order: least recently used first -> eviction order

Rules:
1. Price: a resident generation costs `measure_nbytes(gen)` (a draft model's
   weights and pool included); the set holds
   their sum (`held_bytes`), which is what /admin/models reports as the
   total. A factory that sets `Generation.nbytes` (tests) is taken at its word.
2. A newcomer is priced before loading from its files on disk
   (`estimate_nbytes`: weights, plus a draft model's and a side-car encoder's) times
   ESTIMATE_MARGIN; its KV pool is then planned at load time against what the
   others leave (models/budget.py, `reserved_bytes`), so a resident model's
   pool is never shrunk for a newcomer -- each newcomer gets what is left,
   capped by max_kv_pool_bytes and its entry's `max_kv_bytes`.
3. Eviction (`victims`): least recently used first, only idle generations
   (no lease), never a pinned one (keep_alive < 0), never one younger than
   min_generation_s; the fewest LRU victims that free enough. None when the
   idle ones cannot free enough (the hub then waits for leases, bounded by
   evict_wait_s, then answers 503 + Retry-After with the reason).
4. A model that cannot fit even alone (estimate > the whole budget less
   headroom) is refused with 507 `model_too_large` and the numbers: no
   eviction or retry can help, unlike a 503.
5. max_resident_models > 0 caps the count as well (1 = the old single-model
   swap); 0 = memory alone decides.
6. Idle eviction (`expired`): a resident idle for its keep_alive (the
   request's, else its entry's `keep_alive` in models.toml, else the daemon's
   `keep_alive_s`; `keep_alive_of`) is evicted; keep_alive 0 evicts as soon
   as the last lease ends; negative = pinned; None = never idle-evicted. The
   hub's reaper looks every quarter of the shortest keep-alive, in [0.05,
   0.25] s (`reap_interval_s`: a model loaded later may bring a shorter one).
7. The budget (`memory_budget`) is the device budget (the `kv_budget_bytes`
   override, else `Backend.memory_budget()`) less `memory_headroom_fraction`
   of it: the same arithmetic as models/budget.py, so the resident set and
   each KV plan agree.
8. After a load publishes, a newcomer that measured larger than its estimate
   (`over_budget`) pushes out LRU idle generations until the sum fits again;
   when only busy or pinned ones are left, the set stays over budget (a
   warning) rather than cut a stream.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..backend import Backend
from ..config import HubConfig
from ..errors import FrinkError, InsufficientMemory
from ..models.budget import weights_nbytes
from ..registry import ModelSpec, Registry, resolve_source
from .generation import Generation

log = logging.getLogger("frink_mlx.hub")

ESTIMATE_MARGIN = 1.1  # rule 2: a newcomer's weights estimate, plus a minimal KV pool
_WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz", ".bin")


def measure_nbytes(gen: Generation) -> int:
    """Rule 1: weights + reserved KV pool + a draft model's weights and pool + a side-car
    encoder's weights, in bytes."""
    if gen.nbytes:
        return gen.nbytes
    plan, loaded = gen.plan, gen.loaded
    model = getattr(loaded, "model", None)
    total = plan.weights_bytes if plan is not None else 0
    if plan is None and model is not None:
        total = weights_nbytes(model)
    total += (plan.pool_bytes + plan.draft_bytes + plan.state_bytes) if plan is not None else 0
    embedder = gen.embedder
    own_encoder = getattr(loaded, "encoder", None)
    if embedder is not None and embedder is not own_encoder and gen.spec.embeddings != "self":
        total += weights_nbytes(embedder.model)
    return int(total)


def files_nbytes(spec: ModelSpec) -> int:
    """Bytes of a checkpoint's weight files on disk; 0 when unknown."""
    try:
        path = resolve_source(spec)
    except FrinkError:
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in Path(path).iterdir()
               if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))


def estimate_nbytes(spec: ModelSpec, registry: Registry) -> int:
    """Rule 2: what loading `spec` will cost, before loading it (its draft model's and
    side-car encoder's files included)."""
    total = files_nbytes(spec)
    for other in (spec.draft, spec.embeddings if spec.embeddings != "self" else None):
        if other:
            try:
                total += files_nbytes(registry.resolve(other))
            except FrinkError:
                pass
    return int(total * ESTIMATE_MARGIN)


def memory_budget(config: HubConfig, backend: Backend) -> int:
    """Rule 7: the device budget less the headroom, in bytes."""
    budget = config.budget
    total = budget.kv_budget_bytes or backend.memory_budget().nbytes
    return int(total - budget.memory_headroom_fraction * total)


def keep_alive_of(spec: ModelSpec, config: HubConfig) -> float | None:
    """Rule 6: the entry's keep-alive, else the daemon's."""
    return spec.keep_alive if spec.keep_alive is not None else config.keep_alive_s


@dataclass(slots=True)
class Resident:
    """One resident generation and what the policy needs to know about it."""

    gen: Generation
    nbytes: int
    last_used: float                  # time.monotonic()
    keep_alive_s: float | None        # None = never idle-evicted; < 0 = pinned

    @property
    def pinned(self) -> bool:
        return self.keep_alive_s is not None and self.keep_alive_s < 0


class Residency:
    """The resident set (rules 1-6, 8); the hub is its only writer."""

    def __init__(self, budget_bytes: int, max_models: int = 0) -> None:
        self.budget_bytes = budget_bytes   # device budget less headroom
        self.max_models = max_models
        self.residents: dict[str, Resident] = {}   # by entry name, LRU first
        self._active: str | None = None             # hub rule 1's "default"

    # --- reading -----------------------------------------------------------------
    def held_bytes(self) -> int:
        return sum(r.nbytes for r in self.residents.values())

    def free_bytes(self) -> int:
        return self.budget_bytes - self.held_bytes()

    def generations(self) -> list[Generation]:
        """Least recently used first."""
        return [r.gen for r in self.residents.values()]

    def find(self, name: str | None) -> Generation | None:
        for resident in reversed(self.residents.values()):  # most recent first
            if resident.gen.answers_to(name) and name not in (None, "default"):
                return resident.gen
        return None

    def active(self) -> Generation | None:
        """The one activated last (or, once it is gone, the one loaded last)."""
        resident = self.residents.get(self._active or "")
        if resident is not None:
            return resident.gen
        return max(self.generations(), key=lambda g: g.number, default=None)

    def get(self, gen: Generation) -> Resident | None:
        resident = self.residents.get(gen.name)
        return resident if resident is not None and resident.gen is gen else None

    # --- writing -----------------------------------------------------------------
    def add(self, gen: Generation, keep_alive_s: float | None) -> Resident:
        resident = Resident(gen, measure_nbytes(gen), time.monotonic(), keep_alive_s)
        self.residents.pop(gen.name, None)
        self.residents[gen.name] = resident
        self._active = gen.name
        return resident

    def activate(self, gen: Generation) -> None:
        self.touch(gen)
        if self.get(gen) is not None:
            self._active = gen.name

    def remove(self, gen: Generation) -> bool:
        if self.get(gen) is None:
            return False
        del self.residents[gen.name]
        return True

    def touch(self, gen: Generation) -> None:
        """Most recently used now (moves it to the end of the LRU order)."""
        resident = self.residents.pop(gen.name, None)
        if resident is None:
            return
        resident.last_used = time.monotonic()
        self.residents[gen.name] = resident

    # --- the policy --------------------------------------------------------------
    def check_fits_alone(self, spec: ModelSpec, need_bytes: int) -> None:
        """Rule 4: refuse (507) a model that cannot fit even with nothing else loaded."""
        if need_bytes > self.budget_bytes:
            raise InsufficientMemory(
                f"The model '{spec.name}' needs about {need_bytes} bytes (weights and a minimal "
                f"KV pool) but the memory budget is {self.budget_bytes} bytes even with nothing "
                "else loaded; use a smaller or quantized checkpoint, or raise kv_budget_bytes / "
                "lower memory_headroom_fraction.", param="model")

    def victims(self, need_bytes: int, busy: Callable[[Generation], bool],
                min_age_s: float = 0.0) -> list[Generation] | None:
        """Rule 3: the fewest LRU idle generations to evict so `need_bytes` fit; [] when
        it fits already; None when the idle ones cannot make room. (The count cap, rule
        5, is applied after a load publishes: hub rule 2.)"""
        free = self.free_bytes()
        chosen: list[Generation] = []
        now = time.monotonic()
        for resident in self.residents.values():
            if free >= need_bytes:
                return chosen
            gen = resident.gen
            if resident.pinned or busy(gen) or now - gen.created_at < min_age_s:
                continue
            chosen.append(gen)
            free += resident.nbytes
        return chosen if free >= need_bytes else None

    def blockers(self, busy: Callable[[Generation], bool]) -> str:
        """Why `victims` found no room: the models holding it, for the 503's message."""
        held = [f"'{r.gen.name}' ({r.nbytes} bytes, "
                + ("pinned" if r.pinned else "in use" if busy(r.gen) else "just loaded") + ")"
                for r in self.residents.values()]
        return ", ".join(held) or "nothing"

    def over_count(self, newcomer: Generation) -> list[Generation]:
        """Rule 5 (hub rule 2): the LRU generations beyond max_models, never the newcomer
        nor a pinned one, retired whether or not they are busy."""
        if not self.max_models:
            return []
        extra = len(self.residents) - self.max_models
        old = [r.gen for r in self.residents.values() if r.gen is not newcomer and not r.pinned]
        return old[:max(0, extra)]

    def min_lifetime_left_s(self, min_generation_s: float) -> float:
        """Rule 5 (hub rule 2): how long until the generations a load will replace under
        the count cap have lived min_generation_s; 0 when none must wait."""
        if not self.max_models:
            return 0.0
        extra = len(self.residents) + 1 - self.max_models
        doomed = [r.gen for r in self.residents.values() if not r.pinned][:max(0, extra)]
        now = time.monotonic()
        return max((g.created_at + min_generation_s - now for g in doomed), default=0.0)

    def over_budget(self, newcomer: Generation,
                    busy: Callable[[Generation], bool]) -> list[Generation]:
        """Rule 8: idle LRU generations to retire so the set fits its budget again."""
        if self.free_bytes() >= 0:
            return []
        victims = self.victims(0, lambda g: g is newcomer or busy(g))
        if victims is None:
            log.warning("resident models hold %d bytes, over the budget of %d: %s",
                        self.held_bytes(), self.budget_bytes, self.blockers(busy))
            return []
        return victims

    def reap_interval_s(self, default_keep_alive_s: float | None) -> float:
        """Rule 6: how often the idle reaper looks."""
        alives = [r.keep_alive_s for r in self.residents.values()
                  if r.keep_alive_s is not None and r.keep_alive_s > 0]
        if default_keep_alive_s:
            alives.append(default_keep_alive_s)
        return max(0.05, min([0.25, *(k / 4 for k in alives)]))

    def expired(self, busy: Callable[[Generation], bool]) -> list[Generation]:
        """Rule 6: idle residents past their keep-alive."""
        now = time.monotonic()
        return [r.gen for r in self.residents.values()
                if r.keep_alive_s is not None and r.keep_alive_s >= 0 and not busy(r.gen)
                and now - max(r.last_used, r.gen.created_at) >= r.keep_alive_s]
