"""`frink-mlx serve`: bind, load the default model, print one ready line, drain on signals.

Rules:
1. The backend is selected first, before anything imports MLX: on the CPU
   backend that may re-exec with OpenBLAS (backend/select.py rule 3).
2. The socket is bound here (port 0 picks a free one), so the ready line can
   name the real address; a non-loopback bind without an API key is refused
   (http/security.py `check_bind`).
3. Exactly one line on stdout, JSON, once the default model is loaded and the
   socket is accepting -- for supervisors and scripts:
       {"event": "ready", "url": "http://127.0.0.1:8177", "host": ..., "port": ...,
        "pid": 123, "version": "0.1.0", "model": "smollm2", "generation": 1}
   Logs go to stderr.
4. SIGTERM / SIGINT: stop accepting, let in-flight requests finish for up to
   `settings.drain_timeout_s`, cancel the rest, shut the engines down, exit 0.
   (uvicorn's own handler re-raises the signal after shutdown, which would
   make a clean drain exit 143/130; ours does not.) A second SIGINT forces.
5. `--distributed HOSTFILE --rank R` (or started by `mlx.launch`): every rank
   joins the group first (blocking until all have); rank 0 goes on as below
   with a generation factory that shards and tells the followers
   (serving/distributed.py); the other ranks print no ready line and serve
   rank 0's plans until it stops the group (exit 0) or is lost (exit 1).
6. Rank 0 of a lost group (engine/channel.py) answers 503 with the reason
   for `distributed_exit_after_lost_s`, then drains and exits 1: the
   supervisor restarts it, and every rank joins the new group (the followers
   exit by themselves once rank 0 is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any, Iterator, NoReturn

from . import __version__
from .settings import Settings, environ_snapshot

log = logging.getLogger("frink_mlx.server")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (rule 2)."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def base_url(sock: socket.socket) -> tuple[str, str, int]:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}", host, port


def ready_line(url: str, host: str, port: int, app: Any) -> str:
    state = getattr(app.state, "frink", None)
    gen = state.hub.current if state is not None else None
    return json.dumps({"event": "ready", "url": url, "host": host, "port": port,
                       "pid": os.getpid(), "version": __version__,
                       "model": gen.spec.name if gen else None,
                       "generation": gen.number if gen else None})


def _server_class() -> Any:
    import uvicorn

    class DaemonServer(uvicorn.Server):
        """uvicorn.Server that drains on a signal and does not re-raise it (rule 4)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            sigs = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return DaemonServer


async def _announce(server: Any, url: str, host: str, port: int, app: Any) -> None:
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.02)
    sys.stdout.write(ready_line(url, host, port, app) + "\n")
    sys.stdout.flush()


async def _serve(server: Any, sock: socket.socket, url: str, host: str, port: int,
                 app: Any) -> None:
    announce = asyncio.create_task(_announce(server, url, host, port, app))
    try:
        await server.serve(sockets=[sock])
    finally:
        announce.cancel()


def configure_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve_command(settings: Settings, args: argparse.Namespace | None = None) -> int:
    """Serve until SIGTERM/SIGINT; a clean stop leaves through `_exit_without_finalisation`."""
    from .backend import select_backend

    backend = select_backend(settings.backend_config(), argv=sys.argv, environ=environ_snapshot())
    configure_logging(settings)
    from .http.security import check_bind

    check_bind(settings)
    import uvicorn

    from .app import create_app
    from .registry import load_registry

    registry = load_registry(settings)
    factory, channel = _join_group(settings, registry, backend) if settings.distributed else (None, None)
    app = create_app(settings, registry=registry, backend=backend, factory=factory,
                     cluster=channel)
    sock = bind_socket(settings.host, settings.port)
    url, host, port = base_url(sock)
    config = uvicorn.Config(app, log_level=settings.log_level, access_log=False, lifespan="on",
                            timeout_graceful_shutdown=max(1, int(settings.drain_timeout_s)),
                            log_config=None)
    server = _server_class()(config)
    if channel is not None:
        _exit_when_lost(channel, server, settings.distributed_exit_after_lost_s)
    log.info("frink-mlx %s listening on %s (loading the default model)", __version__, url)
    try:
        asyncio.run(_serve(server, sock, url, host, port, app))
    except SystemExit:  # uvicorn exits 3 when the lifespan (default model load) fails
        if server.started:
            raise
    if not server.started:
        print("frink-mlx: error: the daemon did not start (see the log above)", file=sys.stderr)
        return 2
    if channel is not None:
        channel.stop(tell_followers=True)
    log.info("frink-mlx stopped")
    _exit_without_finalisation(1 if channel is not None and channel.lost else 0)


def _join_group(settings: Settings, registry: Any, backend: Any) -> tuple[Any, Any]:
    """Rule 5: join the group; rank 0 gets (generation factory, channel), the others never return."""
    from .backend.distributed import init_group
    from .engine.channel import PlanChannel
    from .serving import distributed

    group = init_group(settings.group_config())
    channel = PlanChannel(group, timeout_s=settings.distributed_timeout_s,
                          load_timeout_s=settings.distributed_load_timeout_s,
                          ping_s=settings.distributed_ping_s)
    if not group.is_leader:
        _exit_without_finalisation(distributed.serve_follower(
            channel, group, registry, settings.hub_config(), backend))
    channel.start_watch()
    return distributed.leader_factory(channel, group), channel


def _exit_when_lost(channel: Any, server: Any, after_s: float | None) -> None:
    """Rule 6: once the group is lost, /health says why for `after_s`, then rank 0 stops
    and exits 1, so its supervisor (launchd KeepAlive) starts the group again."""
    if after_s is None:
        return

    def stop() -> None:
        log.error("the distributed group is lost; stopping so the supervisor restarts it")
        server.should_exit = True
        threading.Timer(60.0, lambda: os._exit(1)).start()  # if the drain itself hangs

    channel.on_lost.append(lambda _reason: threading.Timer(after_s, stop).start())


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
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
