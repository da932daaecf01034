"""`frink-mlx serve`: bind, serve at once, load the default model, drain on signals.

Rules:
1. The backend is selected first, before anything imports MLX: on the CPU
   backend that may re-exec with OpenBLAS (backend/select.py rule 3).
2. Start-up refusals are one `frink-mlx: error: ...` line with a hint and
   exit 2, checked before anything loads: a non-loopback bind without an API
   key (http/binding.py `check_bind`), a bad models.toml, a default model
   whose source is missing (registry rule 5; with models/sources.py's check
   installed, so a Hugging Face repo offline and not cached or a missing
   Ollama model counts), a port that is busy or not
   ours to bind. The socket is bound here (port 0 picks a free one), so the
   ready line can name the real address.
3. The socket serves before the model is in: the default model loads in the
   lifespan's background (app.py rule 1), /health answers "loading" with its
   progress at once, generation routes 503 + Retry-After. Exactly one line on
   stdout, JSON, once the model is loaded -- for supervisors and scripts:
       {"event": "ready", "url": "http://127.0.0.1:8177", "host": ..., "port": ...,
        "pid": 123, "version": "0.1.0", "model": "smollm2", "generation": 1}
   If that load fails, the reason is the one error line and the exit is 2.
   Logs go to stderr.
4. SIGTERM / SIGINT: drain (app.py rule 2) while the listener stays open --
   new generation work gets 503 + Retry-After in its protocol's envelope,
   streams in flight finish for up to `settings.drain_timeout_s`, the rest
   end on an error frame -- then uvicorn closes the listener, the engines
   shut down, exit 0. (uvicorn's own handler stops listening at once and
   re-raises the signal after shutdown, which would make a clean drain exit
   143/130; ours does neither.) A second SIGINT forces.
5. Connection timeouts (http/timeouts.py): headers within
   `header_timeout_s`, idle keep-alive connections closed after
   `idle_timeout_s`, a response its client reads nothing of for
   `send_timeout_s` aborted, connections past `max_connections` refused at
   once; bodies are held to `body_timeout_s` by the middleware.
6. `--distributed HOSTFILE --rank R` (or started by `mlx.launch`): every rank
   joins the group first (blocking until all have), before the socket is
   bound; rank 0 goes on as below with a generation factory that shards and
   tells the followers (serving/distributed.py); the other ranks bind no
   socket, print no ready line and serve rank 0's plans until it stops the
   group (exit 0) or is lost (exit 1).
7. Rank 0 of a lost group (engine/channel.py) answers 503 with the reason
   for `distributed_exit_after_lost_s`, then drains and exits 1: the
   supervisor restarts it, and every rank joins the new group (the followers
   exit by themselves once rank 0 is gone).
8. A group started by `mlx.launch` ends with it. The launcher runs each rank
   as its own child and, on SIGTERM, dies without stopping them: rank 0
   would keep serving and the follower keep following, orphaned. So rank 0
   of such a group watches its parent and, once it is gone (the process is
   re-parented), drains and stops the group as on SIGTERM (rules 4, 6).
9. Open files: the soft RLIMIT_NOFILE is raised (up to the hard limit) to
   `max_connections` plus OPEN_FILES_RESERVE for models, logs and pipes --
   macOS starts a LaunchAgent with 256, and an `accept()` failing for want of
   a descriptor stalls every new client. A hard limit too low for that is
   one warning; the plist and the unit raise both (service.py rule 6).
10. Access lines go to stderr with the rest of the log, or with
   `access_log_file` to that file alone, rotated past `access_log_max_bytes`
   with `access_log_backups` old files kept.
11. TLS: with `ssl_certfile` and `ssl_keyfile` uvicorn serves HTTPS on the
   same socket and the ready line's URL says https (http/binding.py
   `check_tls` refuses half a pair or an unreadable file first; a
   non-loopback address without TLS is one warning).
12. Once the default model is in, before the ready line, the start-up heap
   (modules, the model's Python objects, tokenizer and template tables) is
   collected once and frozen (`gc.freeze`): the cyclic GC's full collections
   then walk only what was made since. Each one pauses every thread -- the
   event loop, /health with it -- for as long as the heap takes to walk: 54 ms
   for the 105,000 objects of a daemon with a tiny model in on a loaded 2-core
   machine, 8 ms once frozen (the line logged says both). The default model's
   generation is frozen with it; when it is retired, serving/release.py rule 2
   unfreezes the heap for the collections that free it and freezes what is
   alive again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from .. import __version__
from ..errors import ConfigError, ModelUnavailable
from ..settings import Settings, environ_snapshot, started_by_mlx_launch

if TYPE_CHECKING:  # types only: serving/ and engine/ are imported once the backend is chosen
    import uvicorn
    from starlette.applications import Starlette

    from ..backend import Backend
    from ..engine.channel import PlanChannel
    from ..registry import Registry
    from ..serving.frontend import Frontend
    from ..serving.generation import GenerationFactory
    from .draining_server import DaemonServer

log = logging.getLogger("frink_mlx.server")  # the name log lines have always carried


def bind_socket(host: str, port: int, send_buffer_bytes: int | None = None) -> socket.socket:
    """A listening TCP socket on host:port (rule 2); ConfigError with a hint if refused.
    `send_buffer_bytes` caps the kernel send buffer every accepted connection inherits
    (http/timeouts.py rule 6: how much a stalled reader is sent before it is noticed)."""
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror} "
                          "(check --host / FRINK_MLX_HOST)") from None
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if send_buffer_bytes is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ConfigError(_bind_refusal(host, port, exc)) from None
    sock.set_inheritable(True)
    return sock


def _bind_refusal(host: str, port: int, exc: OSError) -> str:
    where = f"cannot listen on {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"{where}: the port is already in use (another frink-mlx? "
                "`frink-mlx service status` tells; pick another with --port N, or --port 0 "
                "for a free one)")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{where}: permission denied (ports below 1024 need privileges; use --port N)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{where}: no such address on this machine (check --host)"
    return f"{where}: {exc.strerror or exc}"


def check_default_model(registry: Registry) -> None:
    """Rule 2: refuse to start when the default model's source is missing."""
    try:
        registry.available(None)
    except ModelUnavailable as exc:
        raise ConfigError(
            f"the daemon did not start: the default model '{exc.name}' is unavailable: "
            f"{exc.reason} (fix its source in {registry.path}, or serve another entry with "
            "--model NAME; `frink-mlx models` lists them)") from None


def base_url(sock: socket.socket, tls: bool = False) -> tuple[str, str, int]:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{shown}:{port}", host, port


def _front(app: Starlette) -> Frontend | None:
    """The app's Frontend (http/frontend.py); imported here, after the backend is chosen."""
    from ..http.frontend import frontend_of

    return frontend_of(app)


def ready_line(url: str, host: str, port: int, app: Starlette) -> str:
    front = _front(app)
    gen = front.hub.current if front is not None else None
    return json.dumps({"event": "ready", "url": url, "host": host, "port": port,
                       "pid": os.getpid(), "version": __version__,
                       "model": gen.spec.name if gen else None,
                       "generation": gen.number if gen else None})


async def _announce(server: DaemonServer, url: str, host: str, port: int, app: Starlette) -> None:
    """Rule 3: the ready line once serving and loaded, or the refusal and exit 2."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.02)
    front = _front(app)
    if front is not None and front.startup is not None:
        try:
            await asyncio.shield(front.startup)
        except Exception as exc:  # noqa: BLE001 - reported as the one refusal line
            server.refusal = (f"the daemon did not start: the default model failed to load: "
                              f"{getattr(exc, 'message', exc)}")
            server.should_exit = True
            return
    if server.should_exit:
        return
    frozen, walked_s, after_s = freeze_startup_heap()
    log.info("start-up heap frozen: %d objects left out of full collections (one took %.0f ms, "
             "%.0f ms once frozen)", frozen, walked_s * 1000, after_s * 1000)
    sys.stdout.write(ready_line(url, host, port, app) + "\n")
    sys.stdout.flush()


def freeze_startup_heap() -> tuple[int, float, float]:
    """Rule 12: one full collection, then what survived is frozen. How many objects are,
    and what a full collection took before and after (seconds)."""
    started = time.perf_counter()
    gc.collect()
    walked_s = time.perf_counter() - started
    gc.freeze()
    started = time.perf_counter()
    gc.collect()
    return gc.get_freeze_count(), walked_s, time.perf_counter() - started


async def _serve(server: DaemonServer, sock: socket.socket, url: str, host: str, port: int,
                 app: Starlette, drain_timeout_s: float) -> None:
    async def drain() -> None:
        front = _front(app)
        cut = await front.drain(drain_timeout_s) if front is not None else 0
        log.info("drained (%d stream(s) cut at the limit)", cut)

    server.drain, server.drain_timeout_s = drain, drain_timeout_s
    announce = asyncio.create_task(_announce(server, url, host, port, app))
    try:
        await server.serve(sockets=[sock])
    finally:
        announce.cancel()


def uvicorn_config(settings: Settings, app: Starlette) -> uvicorn.Config:
    """uvicorn's Config for `app` under `settings` (rule 5's timers); the socket is ours."""
    import uvicorn

    from ..http.timeouts import guarded_protocol

    return uvicorn.Config(app, log_level=settings.log_level, access_log=False, lifespan="on",
                          timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
                          timeout_keep_alive=settings.idle_timeout_s,  # type: ignore[arg-type]
                          http=guarded_protocol(settings.header_timeout_s,
                                                settings.send_timeout_s,
                                                settings.max_connections),
                          ssl_certfile=_expanded(settings.ssl_certfile),
                          ssl_keyfile=_expanded(settings.ssl_keyfile), log_config=None)


def _expanded(path: str | None) -> str | None:
    return str(Path(path).expanduser()) if path else None


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.access_log_file:  # rule 10
        from logging.handlers import RotatingFileHandler

        path = Path(settings.access_log_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(path, maxBytes=settings.access_log_max_bytes,
                                      backupCount=settings.access_log_backups, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        access = logging.getLogger("frink_mlx.access")
        access.addHandler(handler)
        access.propagate = False


OPEN_FILES_RESERVE = 256


def raise_open_files(max_connections: int) -> None:
    """Rule 9: the soft RLIMIT_NOFILE raised to max_connections plus OPEN_FILES_RESERVE."""
    try:
        import resource
    except ImportError:  # not POSIX
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + OPEN_FILES_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):  # macOS may cap below `hard`
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning("open-files limit %d is below max_connections %d + %d; new connections "
                    "may fail (raise `ulimit -n` or lower --max-connections)", soft,
                    max_connections, OPEN_FILES_RESERVE)


def serve_command(settings: Settings, args: argparse.Namespace | None = None) -> int:
    """Serve until SIGTERM/SIGINT; a clean stop leaves through `_exit_without_finalisation`."""
    from ..backend import select_backend

    backend = select_backend(settings.backend_config(), argv=sys.argv, environ=environ_snapshot())
    configure_logging(settings)
    from ..http.binding import check_bind

    check_bind(settings)
    raise_open_files(settings.max_connections)
    from ..models.sources import source_checker
    from ..registry import load_registry, warn_unavailable

    registry = load_registry(settings)
    registry.source_check = source_checker(settings.load_config())  # Hub/Ollama entries too
    check_default_model(registry)
    launched = started_by_mlx_launch()  # read before _join_group exports MLX_RANK itself
    factory, channel = _join_group(settings, registry, backend) if settings.distributed else (None, None)
    sock = bind_socket(settings.host, settings.port, settings.send_buffer_bytes)
    warn_unavailable(registry)
    from ..app import create_app

    app = create_app(settings, registry=registry, background_load=True, backend=backend,
                     factory=factory, cluster=channel)
    url, host, port = base_url(sock, tls=bool(settings.ssl_certfile))
    from .draining_server import DaemonServer

    server = DaemonServer(uvicorn_config(settings, app))
    if channel is not None:
        _exit_when_lost(channel, server, settings.distributed_exit_after_lost_s)
        if launched:
            _stop_with_launcher()
    log.info("frink-mlx %s listening on %s (loading %s)", __version__, url, registry.default)
    try:
        asyncio.run(_serve(server, sock, url, host, port, app, settings.drain_timeout_s))
    except SystemExit:  # uvicorn exits 3 when the lifespan fails
        if server.started and server.refusal is None:
            raise
    if server.refusal is not None or not server.started:
        reason = server.refusal or "the daemon did not start (see the log above)"
        print(f"frink-mlx: error: {reason}", file=sys.stderr)
        if server.started:  # threads that touched MLX exist now: see below
            _exit_without_finalisation(2)
        return 2
    if channel is not None:
        channel.stop(tell_followers=True)
    log.info("frink-mlx stopped")
    _exit_without_finalisation(1 if channel is not None and channel.lost else 0)


def _join_group(settings: Settings, registry: Registry, backend: Backend
                ) -> tuple[GenerationFactory, PlanChannel]:
    """Rule 6: join the group; rank 0 gets (generation factory, channel), the others never return."""
    from ..backend.distributed import init_group
    from ..engine.channel import PlanChannel
    from ..serving import distributed

    group = init_group(settings.group_config())
    channel = PlanChannel(group, timeout_s=settings.distributed_timeout_s,
                          load_timeout_s=settings.distributed_load_timeout_s,
                          ping_s=settings.distributed_ping_s)
    if not group.is_leader:
        _exit_without_finalisation(distributed.serve_follower(
            channel, group, registry, settings.hub_config(), backend))
    channel.start_watch()
    return distributed.leader_factory(channel, group), channel


def _exit_when_lost(channel: PlanChannel, server: DaemonServer, after_s: float | None) -> None:
    """Rule 7: once the group is lost, /health says why for `after_s`, then rank 0 stops
    and exits 1, so its supervisor (launchd KeepAlive) starts the group again."""
    if after_s is None:
        return

    def stop() -> None:
        log.error("the distributed group is lost; stopping so the supervisor restarts it")
        server.should_exit = True
        threading.Timer(60.0, lambda: os._exit(1)).start()  # if the drain itself hangs

    channel.on_lost.append(lambda _reason: threading.Timer(after_s, stop).start())


def _stop_with_launcher(poll_s: float = 0.5) -> None:
    """Rule 8: SIGTERM ourselves (the drain of rule 4, then Stop to the followers) once
    the parent process -- mlx.launch, or sshd for a remote rank -- is gone."""
    launcher = os.getppid()

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll_s)
        log.warning("the launcher (pid %d) is gone: stopping the group", launcher)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="frink-launcher-watch", daemon=True).start()


def _exit_without_finalisation(code: int) -> NoReturn:
    """Leave after a clean shutdown without running interpreter finalisation.

    Why: MLX keeps a C++ worker thread per stream, and in MLX 0.32 streams
    belong to the thread that made them. Threads that did MLX work beside the
    engine's own (the loader and the embedding encoder run in anyio's worker
    pool) still own theirs when Python finalises, and tearing those down then
    aborts the process ("terminate called without an active exception",
    exit 134) -- measured here in 2 of 3 SIGTERM runs. By this point requests
    are drained, engines joined and pools released; only the logs and stdio
    remain to flush.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a pipe whose reader (mlx.launch) is gone
            stream.flush()
    os._exit(code)
