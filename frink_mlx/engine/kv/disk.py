"""The SSD tier under the block prefix cache: block files in one directory, an LRU
byte budget, and two I/O threads, so that no engine step ever waits for the disk.

Why: the RAM prefix cache (block_pool.py) loses everything on a restart, a swap
or an eviction, and an agent's 20-60k-token prompt costs seconds to tens of
seconds to prefill again. A KV block is content-addressed already (its chained
hash covers the whole prefix, the model's identity and the cache salt:
hashing.py, spill.py), so a file named by that hash can be trusted across
processes, checked by its header (blockfile.py).

One `DiskTier` per daemon (the hub owns it; every engine's `spill.DiskLink`
shares it):

    engine thread                        writer thread            reader thread
    ─────────────                        ─────────────            ─────────────
    idle block -> snapshot (spill.py) ─> offer(job) ─> queue ─> file per block
    prompt arrives -> leading_run() ─────────────────────────────> read(job)
                        <── payloads, checked (blockfile rule 1) ──┘

Rules:
1. Layout: `<directory>/<first 2 hex digits>/<32 hex digits of the hash>.kvb`.
   A file is written to a temporary name and renamed, so a reader sees a whole
   file or none; a torn one (the process died, the disk filled) is refused by
   its checksum anyway (rule 5).
2. Budget: the files' bytes never exceed `budget_bytes`. Before a file is
   written its size is reserved; least recently used files are deleted
   until the reservation fits. Recency is a write or a verified read
   (which also sets the file's mtime, so the order survives a restart: the
   start-up scan orders files by mtime and trims to the budget).
3. Writes never wait: `offer` queues a job only while the queue holds less
   than `queue_bytes`, else returns False (the caller keeps the blocks for
   later or drops them). A block already on disk is not written again.
4. Reads go to their own thread, so a read is never behind a long write.
   `read` stops at the first file that is missing or refused; the blocks
   after it are useless (each hash covers its whole prefix). A file is a
   block's K/V or a part of it, or a recurrent-state snapshot
   (blockfile.py's kinds): the tier sees keys and layouts only.
5. A refused file (blockfile rule 1) is deleted and counted; its blocks are
   recomputed by the engine as any miss. Never an error for a request.
6. A directory that cannot be created or written (read-only, full, no
   permission) turns the tier off with one warning, at start or at the first
   failed write; the daemon serves on with the RAM cache alone.

No MLX here: payloads are bytes-like (spill.py makes them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .blockfile import BadBlockFile, BlockLayout, decode, encode_header

log = logging.getLogger("frink_mlx.engine.kv.disk")

WRITE_QUEUE_BYTES = 512 * 1024 * 1024   # rule 3: snapshots queued for the writer, at most
                                         # (the job being written is not counted)
SUFFIX = ".kvb"
STALE_TMP_S = 600.0                      # a temporary file this old is a dead writer's


@dataclass(slots=True)
class WriteJob:
    """Blocks of one layout to write; `payload(i)` gives block i's bytes (writer thread)."""

    layout: BlockLayout
    hashes: list[int]
    payload: Callable[[int], bytes | memoryview]

    @property
    def nbytes(self) -> int:
        return len(self.hashes) * self.layout.file_nbytes


@dataclass(slots=True)
class ReadJob:
    """Files to read in order, file i of `layouts[i]` under key `hashes[i]` (rule 4)."""

    layouts: list[BlockLayout]
    hashes: list[int]
    deliver: Callable[[list[memoryview]], None]  # called on the reader thread


@dataclass(slots=True)
class DiskStats:
    """A snapshot for /health, /metrics and the page."""

    enabled: bool
    directory: str
    budget_bytes: int
    used_bytes: int = 0
    num_files: int = 0
    queued_bytes: int = 0
    read_requests_total: int = 0    # prompts that asked the disk for a run of blocks
    hit_blocks_total: int = 0       # files read back and verified (blocks, parts, snapshots)
    written_blocks_total: int = 0   # files written
    dropped_blocks_total: int = 0   # snapshots the queue had no room for (rule 3)
    refused_files_total: int = 0    # torn, corrupt, foreign or older files deleted (rule 5)
    evicted_files_total: int = 0    # deleted for the budget (rule 2)
    error: str | None = None        # why the tier is off (rule 6)


@dataclass(slots=True)
class _Queue:
    jobs: deque[WriteJob | ReadJob] = field(default_factory=deque)
    nbytes: int = 0
    busy: bool = False


class DiskTier:
    """The block files of one cache directory (module rules)."""

    def __init__(self, directory: str | Path, budget_bytes: int,
                 queue_bytes: int = WRITE_QUEUE_BYTES) -> None:
        self.directory = Path(directory).expanduser()
        self.budget_bytes = budget_bytes
        self.queue_bytes = queue_bytes
        self._lock = threading.Condition()
        self._index: OrderedDict[int, int] = OrderedDict()  # hash -> file bytes, LRU first
        self._used = 0
        self._writes, self._reads = _Queue(), _Queue()
        self._closing = False
        self.stats = DiskStats(enabled=False, directory=str(self.directory),
                               budget_bytes=budget_bytes)
        self._threads: list[threading.Thread] = []
        if self._prepare():
            self.stats.enabled = True
            for name, queue in (("writer", self._writes), ("reader", self._reads)):
                thread = threading.Thread(target=self._serve, args=(queue,),
                                          name=f"frink-kv-disk-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)

    # -- start-up --------------------------------------------------------------

    def _prepare(self) -> bool:
        """Rule 6 at start: the directory must be writable; then rule 2's scan."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{os.getpid()}-{threading.get_ident()}"
            probe.write_bytes(b"frink")
            probe.unlink()
        except OSError as exc:
            self._turn_off(exc)
            return False
        self._scan()
        return True

    def _scan(self) -> None:
        found: list[tuple[float, int, int, Path]] = []
        now = time.time()
        for sub in self.directory.iterdir():
            if not (sub.is_dir() and len(sub.name) == 2):
                continue
            for entry in os.scandir(sub):
                path = Path(entry.path)
                try:
                    info = entry.stat()
                    if path.suffix == SUFFIX and len(path.stem) == 32:
                        found.append((info.st_mtime, int(path.stem, 16), info.st_size, path))
                    elif ".tmp" in path.name and now - info.st_mtime > STALE_TMP_S:
                        path.unlink()
                except (OSError, ValueError):
                    continue
        found.sort()
        for _, block_hash, size, _ in found:
            self._index[block_hash] = size
            self._used += size
        self._evict_for(0)
        self._refresh()

    # -- the engine side (any thread) --------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.stats.enabled

    def has(self, block_hash: int) -> bool:
        with self._lock:
            return self.stats.enabled and block_hash in self._index

    def touch(self, block_hash: int) -> None:
        """A block still in use in RAM: keep its file longest (rule 2), in memory only."""
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)

    def leading_run(self, hashes: Sequence[int]) -> int:
        """How many of `hashes`, from the first, have a file."""
        with self._lock:
            if not self.stats.enabled:
                return 0
            for num, block_hash in enumerate(hashes):
                if block_hash not in self._index:
                    return num
            return len(hashes)

    def room_bytes(self) -> int:
        """What `offer` would accept now (rule 3); 0 while the tier is off."""
        with self._lock:
            if not self.stats.enabled or self._closing:
                return 0
            return max(0, self.queue_bytes - self._writes.nbytes)

    def offer(self, job: WriteJob) -> bool:
        """Queue `job` for the writer, or False (nothing queued) when there is no room."""
        with self._lock:
            if not self.stats.enabled or self._closing or \
                    self._writes.jobs and self._writes.nbytes + job.nbytes > self.queue_bytes:
                self.stats.dropped_blocks_total += len(job.hashes)
                return False
            self._writes.jobs.append(job)
            self._writes.nbytes += job.nbytes
            self._lock.notify_all()
            return True

    def read(self, job: ReadJob) -> bool:
        """Ask the reader for `job`'s leading run (rule 4); False when the tier is off."""
        with self._lock:
            if not self.stats.enabled or self._closing:
                return False
            self.stats.read_requests_total += 1
            self._reads.jobs.append(job)
            self._lock.notify_all()
            return True

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no job is queued or running (tests, benchmarks, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while any(q.jobs or q.busy for q in (self._writes, self._reads)):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return True

    def snapshot(self) -> DiskStats:
        with self._lock:
            self._refresh()
            return dataclasses.replace(self.stats)

    def close(self, timeout_s: float) -> None:
        """Finish the queued writes for up to `timeout_s`, then stop the threads."""
        self.wait_idle(timeout_s)
        with self._lock:
            self._closing = True
            self._writes.jobs.clear()
            self._reads.jobs.clear()
            self._writes.nbytes = 0
            self._lock.notify_all()
        for thread in self._threads:
            thread.join(timeout=5.0)

    # -- the I/O threads -----------------------------------------------------------

    def _serve(self, queue: _Queue) -> None:
        while True:
            with self._lock:
                while not queue.jobs and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                job = queue.jobs.popleft()
                if isinstance(job, WriteJob):
                    queue.nbytes -= job.nbytes
                queue.busy = True
            try:
                if isinstance(job, WriteJob):
                    self._write(job)
                else:
                    self._read(job)
            except Exception:  # noqa: BLE001 - an I/O thread must outlive any one job
                log.exception("KV disk tier: a %s job failed", type(job).__name__)
            finally:
                del job  # its callbacks reach an engine: a retired generation must not linger
                with self._lock:
                    queue.busy = False
                    self._lock.notify_all()

    def _path(self, block_hash: int) -> Path:
        name = f"{block_hash:032x}"
        return self.directory / name[:2] / (name + SUFFIX)

    def _write(self, job: WriteJob) -> None:
        size = job.layout.file_nbytes
        for i, block_hash in enumerate(job.hashes):
            with self._lock:
                if not self.stats.enabled or self._closing:
                    return
                if block_hash in self._index:
                    self._index.move_to_end(block_hash)
                    continue
                if size > self.budget_bytes:
                    self.stats.dropped_blocks_total += 1
                    continue
                victims = self._evict_for(size)
                self._used += size  # reserved (rule 2) before a byte is written
            for path in victims:
                path.unlink(missing_ok=True)
            if not self._write_file(job, i, block_hash, size):
                return

    def _write_file(self, job: WriteJob, index: int, block_hash: int, size: int) -> bool:
        path = self._path(block_hash)
        tmp = path.with_name(f"{path.stem}.tmp{os.getpid()}")
        try:
            payload = job.payload(index)
            header = encode_header(job.layout, block_hash, payload)
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as out:
                out.write(header)
                out.write(payload)
            os.replace(tmp, path)
        except OSError as exc:
            with self._lock:
                self._used -= size
            tmp.unlink(missing_ok=True)
            self._turn_off(exc)
            return False
        with self._lock:
            self._index[block_hash] = size
            self.stats.written_blocks_total += 1
        return True

    def _read(self, job: ReadJob) -> None:
        payloads: list[memoryview] = []
        for layout, block_hash in zip(job.layouts, job.hashes):
            payload = self._read_file(layout, block_hash)
            if payload is None:
                break
            payloads.append(payload)
        with self._lock:
            self.stats.hit_blocks_total += len(payloads)
        job.deliver(payloads)

    def _read_file(self, layout: BlockLayout, block_hash: int) -> memoryview | None:
        path = self._path(block_hash)
        try:
            with open(path, "rb") as f:
                data = f.read(layout.file_nbytes + 1)  # one byte more: a longer file is refused
            payload = decode(layout, block_hash, data)
        except BadBlockFile as exc:
            log.warning("KV disk tier: refusing %s (%s); its blocks are recomputed", path.name, exc)
            self._forget(block_hash, path, refused=True)
            return None
        except OSError:  # gone meanwhile (evicted by the budget, removed by hand)
            self._forget(block_hash, path, refused=False)
            return None
        with self._lock:
            if block_hash in self._index:
                self._index.move_to_end(block_hash)
        try:
            os.utime(path)  # rule 2: recency survives a restart
        except OSError:
            pass
        return payload

    # -- bookkeeping (callers hold no file open) ---------------------------------------

    def _forget(self, block_hash: int, path: Path, *, refused: bool) -> None:
        if refused:
            path.unlink(missing_ok=True)
        with self._lock:
            size = self._index.pop(block_hash, None)
            if size is not None:
                self._used -= size
            if refused:
                self.stats.refused_files_total += 1

    def _evict_for(self, nbytes: int) -> list[Path]:
        """Drop LRU entries until `nbytes` more fit the budget (lock held); their paths."""
        victims: list[Path] = []
        while self._index and self._used + nbytes > self.budget_bytes:
            block_hash, size = self._index.popitem(last=False)
            self._used -= size
            self.stats.evicted_files_total += 1
            victims.append(self._path(block_hash))
        if not self._threads:  # the start-up scan: nobody else can be reading yet
            for path in victims:
                path.unlink(missing_ok=True)
            victims = []
        return victims

    def _refresh(self) -> None:
        self.stats.used_bytes = self._used
        self.stats.num_files = len(self._index)
        self.stats.queued_bytes = self._writes.nbytes

    def _turn_off(self, exc: OSError) -> None:
        """Rule 6: one warning, then the tier stays off."""
        with self._lock:
            if self.stats.error is not None:
                return
            self.stats.enabled = False
            self.stats.error = f"{type(exc).__name__}: {exc}"
            self._writes.jobs.clear()
            self._writes.nbytes = 0
        log.warning("KV disk tier off: cannot write %s (%s); the prefix cache stays in RAM only",
                    self.directory, exc)

