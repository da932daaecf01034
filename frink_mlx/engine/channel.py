"""The plan channel: rank 0 tells every follower what to run, through `mx.distributed`.

Why collectives and not a socket of our own: the issue asks for MLX's own
transport (ring over TCP, JACCL over Thunderbolt RDMA), and a broadcast is one
`all_sum` in which every follower contributes zeros. The forward that follows
uses the same group for its tensor-parallel all-reduces, so every collective a
rank issues must come in the same order on every rank: rank 0 issues them
only while holding `exclusive()`, and followers run messages one at a time.

Wire layout of one message (int32 words, summed across ranks):

    round 1: [ nbytes | tag (4 words) | payload words 0 .. FIRST_WORDS-6 ]   FIRST_WORDS words
    round 2: [ payload words FIRST_WORDS-5 .. ]                 only if it did not fit

The payload is msgpack (msgspec) of one `Message`, zero-padded to whole words;
the tag is rule 6's MAC.
A step's plan (token ids, positions, block tables, copies) fits round 1 for
typical batches; long block tables take the second round.

Failure rules (the group has no timeouts of its own):
1. A follower that exits closes its sockets; MLX's ring backend then raises
   from the pending collective within milliseconds, and the channel is lost.
2. A follower that stops answering without exiting (stopped, wedged, link
   down without a reset) leaves rank 0 blocked inside a collective. A
   watchdog thread marks the channel lost once a collective has run past
   its deadline (`timeout_s`; `load_timeout_s` for a load's commit round) and
   calls `on_lost`, which fails the requests in flight. The thread blocked in
   the collective cannot be freed: it stays parked until the process exits;
   the group must be restarted (README, "Several Macs").
3. While idle, rank 0 sends a `Ping` every `ping_s`, so rule 1 and 2 also
   catch a follower that dies between requests.
4. A follower that hears nothing for `silence_s` (rank 0 gone without closing
   its sockets) exits; its supervisor restarts it.
5. Once lost, the channel stays lost: every later `exclusive()` raises
   `Unavailable` naming the reason, so requests get 503 in their envelope.
6. Every message carries the first 16 bytes of HMAC-SHA256(plan key, its
   sequence number | payload), the key derived when the group proved its
   secret (backend/trust.py rule 4). A follower that receives a message whose
   tag does not verify (a plan injected or replayed on the link) raises and
   leaves the group. Cost: one HMAC of a few hundred bytes per step (~2 us).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import msgspec
import numpy as np

from ..errors import Unavailable
from .plan import SchedulerOutput

log = logging.getLogger("frink_mlx.engine.channel")

FIRST_WORDS = 1024
TAG_WORDS = 4     # rule 6: 16 bytes of HMAC-SHA256
HEAD_WORDS = 1 + TAG_WORDS
MAX_MESSAGE_BYTES = 1 << 28   # a length past this is a corrupt head, not a plan


class Step(msgspec.Struct, tag="step", frozen=True):
    generation: int
    plan: SchedulerOutput


class Load(msgspec.Struct, tag="load", frozen=True):
    generation: int
    model: str


class Commit(msgspec.Struct, tag="commit", frozen=True):
    """Followers answer with `gather` (ok flag, affordable blocks); see follower.py."""

    generation: int


class Free(msgspec.Struct, tag="free", frozen=True):
    generation: int


class Ping(msgspec.Struct, tag="ping", frozen=True):
    pass


class Stop(msgspec.Struct, tag="stop", frozen=True):
    pass


Message = Step | Load | Commit | Free | Ping | Stop

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Message)


def _tag(key: bytes, sequence: int, payload: bytes) -> bytes:
    """Rule 6; no key (a test's channel): zeros."""
    if not key:
        return bytes(4 * TAG_WORDS)
    mac = hmac.new(key, sequence.to_bytes(8, "big") + payload, hashlib.sha256)
    return mac.digest()[:4 * TAG_WORDS]


def encode(message: Message, key: bytes = b"", sequence: int = 0) -> np.ndarray:
    """The payload as int32 words, prefixed by its byte length and tag (module docstring)."""
    payload = _ENCODER.encode(message)
    padded = _tag(key, sequence, payload) + payload + b"\0" * (-len(payload) % 4)
    words = np.frombuffer(padded, dtype=np.int32)
    return np.concatenate([np.array([len(payload)], dtype=np.int32), words])


def decode(words: np.ndarray, key: bytes = b"", sequence: int = 0) -> Message:
    """The message in `words`; a tag that does not verify under `key` raises (rule 6)."""
    nbytes = int(words[0])
    if not 0 <= nbytes <= 4 * (len(words) - HEAD_WORDS):
        raise RuntimeError(f"a plan message claims {nbytes} bytes in {len(words)} words")
    data = words[1:].astype(np.int32).tobytes()
    tag, payload = data[:4 * TAG_WORDS], data[4 * TAG_WORDS:4 * TAG_WORDS + nbytes]
    if key and not hmac.compare_digest(tag, _tag(key, sequence, payload)):
        raise RuntimeError(f"plan message {sequence} failed its MAC (altered or injected on "
                           "the link); leaving the group")
    return _DECODER.decode(payload)


class PlanChannel:
    """Both ends of the broadcast; `group` is backend/distributed.py's `DistributedGroup`."""

    def __init__(self, group: Any, *, timeout_s: float, load_timeout_s: float,
                 ping_s: float) -> None:
        self.group = group
        self.key: bytes = getattr(group, "plan_key", b"")  # rule 6
        self.sequence = 0                                   # messages posted / received
        self.timeout_s, self.load_timeout_s, self.ping_s = timeout_s, load_timeout_s, ping_s
        self.lost: str | None = None
        self.on_lost: list[Callable[[str], None]] = []
        self.collectives_total = 0
        self.posts_total = 0
        self.post_s_total = 0.0   # rank 0: wall time spent broadcasting (benchmarks/dist_bench.py)
        self._lock = threading.Lock()
        self._deadline: float | None = None
        self._last_used = time.monotonic()
        self._waiting_since: float | None = None
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    # -- both ends -------------------------------------------------------------
    def _sum(self, words: np.ndarray) -> np.ndarray:
        out = mx.distributed.all_sum(mx.array(words), group=self.group.group, stream=mx.cpu)
        mx.eval(out)
        self.collectives_total += 1
        return np.array(out, copy=False)

    def gather(self, values: list[int]) -> list[list[int]]:
        """Every rank's `values` (same length everywhere), in rank order."""
        mine = mx.array(np.array(values, dtype=np.int32))
        out = mx.distributed.all_gather(mine[None], group=self.group.group, stream=mx.cpu)
        mx.eval(out)
        self.collectives_total += 1
        return out.tolist()  # type: ignore[return-value]

    # -- rank 0 -------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the group for one exchange; rules 2 and 5."""
        self._check()
        with self._lock:
            self._check()
            self._deadline = time.monotonic() + (timeout_s or self.timeout_s)
            try:
                yield
            except Exception as exc:
                # rule 1 (MLX's ring lost a peer), or a failure after a post: the
                # followers now wait for collectives this rank will never issue
                self.mark_lost(f"{type(exc).__name__}: {exc}")
                raise Unavailable(f"distributed group lost: {exc}", retry_after_s=10.0) from exc
            finally:
                self._deadline = None
                self._last_used = time.monotonic()

    def post(self, message: Message) -> None:
        """Broadcast `message` (inside `exclusive()`)."""
        started = time.perf_counter()
        words = encode(message, self.key, self.sequence)
        self.sequence += 1
        first = np.zeros(FIRST_WORDS, dtype=np.int32)
        head = words[:FIRST_WORDS]
        first[:len(head)] = head
        self._sum(first)
        if len(words) > FIRST_WORDS:
            self._sum(words[FIRST_WORDS:])
        self.posts_total += 1
        self.post_s_total += time.perf_counter() - started

    def _check(self) -> None:
        if self.lost is not None:
            raise Unavailable(f"distributed group lost: {self.lost}; restart the group",
                              retry_after_s=10.0)

    def mark_lost(self, reason: str) -> None:
        if self.lost is not None:
            return
        self.lost = reason
        log.error("distributed group lost: %s", reason)
        for callback in list(self.on_lost):
            try:
                callback(reason)
            except Exception:  # noqa: BLE001 - every callback must run
                log.exception("on_lost callback failed")

    def start_watch(self) -> None:
        """Rank 0: the watchdog (rule 2) and the idle pinger (rule 3)."""
        for target, name in ((self._watch, "frink-dist-watchdog"), (self._ping, "frink-dist-ping")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def _watch(self) -> None:
        while not self._stopping.wait(0.1) and self.lost is None:
            deadline = self._deadline
            if deadline is not None and time.monotonic() > deadline:
                self.mark_lost("a follower rank stopped answering (collective past its deadline)")

    def _ping(self) -> None:
        while not self._stopping.wait(self.ping_s / 4) and self.lost is None:
            if time.monotonic() - self._last_used < self.ping_s:
                continue
            if not self._lock.acquire(blocking=False):
                continue
            self._lock.release()
            with contextlib.suppress(Unavailable), self.exclusive():
                self.post(Ping())

    def stop(self, *, tell_followers: bool) -> None:
        """Rank 0 at shutdown: followers exit on `Stop`."""
        self._stopping.set()
        if tell_followers and self.lost is None:
            with contextlib.suppress(Unavailable), self.exclusive():
                self.post(Stop())

    # -- followers ------------------------------------------------------------------
    def receive(self) -> Message:
        """Block until rank 0 posts the next message."""
        self._waiting_since = time.monotonic()
        try:
            first = self._sum(np.zeros(FIRST_WORDS, dtype=np.int32))
        finally:
            self._waiting_since = None
        nbytes = int(first[0])
        if not 0 <= nbytes <= MAX_MESSAGE_BYTES:
            raise RuntimeError(f"a plan message claims {nbytes} bytes; leaving the group")
        nwords = HEAD_WORDS + -(-nbytes // 4)
        if nwords > FIRST_WORDS:
            rest = self._sum(np.zeros(nwords - FIRST_WORDS, dtype=np.int32))
            first = np.concatenate([first, rest])
        message = decode(first[:nwords], self.key, self.sequence)
        self.sequence += 1
        return message

    def waiting_for_s(self) -> float:
        """How long this follower has been waiting for rank 0's next message (0: busy)."""
        since = self._waiting_since
        return 0.0 if since is None else time.monotonic() - since
