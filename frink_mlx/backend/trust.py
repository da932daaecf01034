"""The group's shared secret: who may be a rank, proven before the first step.

Why: MLX's ring backend (`mx.distributed.init`) takes, on each rank's listening
address, the first TCP connection that arrives and closes the listener; it sends
no greeting and checks nobody. A third process that connects while the group
forms (every start or restart) takes that slot, and after that every collective
-- our plans, the forward's all-reduces -- crosses it in cleartext. We cannot
guard MLX's accept from Python (`init` runs in C++ holding the GIL), so we make
a wrongly formed group fail, within a bound, before it serves anything:

1. Secret: every rank reads the same secret from a file readable by its owner
   only (`distributed_secret_file`, default `<config_dir>/group_secret`;
   `frink-mlx service install --distributed` writes one). A missing, empty,
   short or group/world-readable file is refused before the rank listens.
2. Proof, right after `init` and before any plan: each rank contributes a
   fresh 16-byte nonce (`all_gather`), then HMAC-SHA256(secret, "frink-mlx
   group" | size | every nonce | its own rank) (`all_gather` again), and checks
   every other rank's tag against its own secret. A tag binds its rank and
   this formation's nonces, so neither a tag seen on the wire nor another
   rank's tag can be replayed. Any mismatch: the rank refuses in one line
   naming the ranks whose proof failed, and exits.
3. Bound: a stray that took a slot and says nothing would leave `init` or the
   proof's first collective blocked forever (MLX has no timeouts, and the
   blocked call holds the GIL, so no Python thread can act). A forked
   watchdog that needs no GIL kills the rank, after one line, once
   `distributed_join_timeout_s` passes without a proof. MLX's own ring
   connect retries (~15 s) usually end such a formation first: the rank whose
   peer's slot was taken cannot connect and `init` raises.
4. Plans: the proof derives a session key; every plan the channel posts
   carries a truncated HMAC of (sequence number, payload) under it
   (engine/channel.py rule 6), so a relay between two genuine ranks cannot
   inject or replay a plan.

Left out, and stated in the README: encryption (the ring is plaintext: a
relay on the link reads every step's token ids and hidden states), and
integrity of the forward's own all-reduces and of a load's commit gather,
which are MLX tensors we do not wrap. The ring belongs on a dedicated link.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import select
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ConfigError

SECRET_FILE_NAME = "group_secret"
MIN_SECRET_CHARS = 16
NONCE_BYTES = 16
TAG_BYTES = 32
_LABEL = b"frink-mlx group v1"


def read_secret(path: Path) -> bytes:
    """Rule 1: the secret in `path`, a regular file readable by its owner only."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"no group secret at {path}: every rank needs the same secret file "
                          "(frink-mlx service install --distributed writes one; copy it to "
                          "every machine, mode 0600), or --distributed-secret-file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"group secret {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ConfigError(f"group secret {path} has mode {mode:04o}; it must not be readable "
                          f"by group or others (run: chmod 600 {path})")
    secret = path.read_bytes().strip()
    if len(secret) < MIN_SECRET_CHARS:
        raise ConfigError(f"group secret {path} holds {len(secret)} characters; it needs at "
                          f"least {MIN_SECRET_CHARS} (e.g. `openssl rand -hex 32`)")
    return secret


def ensure_secret(path: Path) -> bool:
    """Write a fresh secret to `path` (mode 0600) unless one is there; True if created."""
    if path.exists():
        read_secret(path)   # an existing file must be usable as it is
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")
    return True


def _tag(secret: bytes, transcript: bytes, rank: int) -> bytes:
    return hmac.new(secret, transcript + rank.to_bytes(4, "big"), hashlib.sha256).digest()


def _all_gather(group: Any, data: bytes) -> list[bytes]:
    """Every rank's `data` (same length everywhere), in rank order."""
    import mlx.core as mx
    import numpy as np

    words = np.frombuffer(data, dtype=np.int32).copy()
    out = mx.distributed.all_gather(mx.array(words)[None], group=group, stream=mx.cpu)
    mx.eval(out)
    return [np.asarray(row, dtype=np.int32).tobytes() for row in np.array(out)]


def prove(group: Any, secret: bytes, *, source: str) -> bytes:
    """Rule 2 over `group` (an `mx.distributed.Group`); the session key for the plan MACs
    (rule 4). Raises ConfigError naming the ranks whose proof failed."""
    rank, size = group.rank(), group.size()
    nonces = _all_gather(group, secrets.token_bytes(NONCE_BYTES))
    transcript = _LABEL + size.to_bytes(4, "big") + b"".join(nonces)
    tags = _all_gather(group, _tag(secret, transcript, rank))
    failed = [r for r, tag in enumerate(tags)
              if r != rank and not hmac.compare_digest(tag, _tag(secret, transcript, r))]
    if failed:
        raise ConfigError(f"rank {rank}: the group refused to form: rank(s) {failed} did not "
                           f"prove the group secret of {source} (every rank needs the same "
                           "secret file)")
    return hmac.new(secret, b"plans" + transcript, hashlib.sha256).digest()


@contextmanager
def join_deadline(timeout_s: float, rank: int | None) -> Iterator[None]:
    """Rule 3: kill this process, after one line on stderr, unless the block ends within
    `timeout_s`. The watchdog is a forked child blocked in `select` on a pipe: it needs
    no GIL, and it ends by itself when the block ends (or this process dies)."""
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the watchdog
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], timeout_s)
        if not ready:
            who = "this rank" if rank is None else f"rank {rank}"
            os.write(2, (f"frink-mlx: error: {who}: the distributed group did not form within "
                         f"{timeout_s:g}s (distributed_join_timeout_s): a rank is missing or "
                         "a stray connection took a ring slot; exiting\n").encode())
            os.kill(parent, signal.SIGKILL)
        os._exit(0)
    os.close(read_fd)
    try:
        yield
    finally:
        os.close(write_fd)
        os.waitpid(pid, 0)
        sys.stderr.flush()
