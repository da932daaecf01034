"""`frink-mlx generate` and `frink-mlx chat`: the command-line front ends.

generate: load the model in process, render the prompt with the chat template
(unless --no-chat-template), stream the answer to stdout, and print prompt and
decode speed to stderr the way `mlx_lm.generate` does.

chat: an mlx-lm-style REPL with multi-turn history. It talks to a running
daemon when one answers `/health` at --url (default: the configured address),
so the model stays loaded between sessions; otherwise (or with --local) it
loads the model in process. Commands: /reset (forget the history), /exit.

Both in-process paths go through the same decode handles, engine and output
pipeline as the daemon, so what you see here is what the server sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .backend import Backend, select_backend
from .local_daemon import daemon_answers, daemon_url
from .settings import Settings, environ_snapshot

Messages = list[dict[str, str]]
Emit = Callable[[str], None]


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# --- in process ------------------------------------------------------------------

@dataclass
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_s: float = 0.0
    decode_s: float = 0.0

    def report(self) -> str:
        p_tps = self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0
        d_tps = (self.completion_tokens - 1) / self.decode_s \
            if self.decode_s > 0 and self.completion_tokens > 1 else 0.0
        lines = ["==========",
                 f"Prompt: {self.prompt_tokens} tokens, {p_tps:.3f} tokens-per-sec",
                 f"Generation: {self.completion_tokens} tokens, {d_tps:.3f} tokens-per-sec"]
        try:
            import mlx.core as mx

            lines.append(f"Peak memory: {mx.get_peak_memory() / 1e9:.3f} GB")
        except (ImportError, AttributeError):
            pass
        return "\n".join(lines)


@dataclass
class LocalModel:
    """A generation built in this process (no HTTP), driven on a private event loop."""

    settings: Settings
    model: str | None
    backend: Backend
    generation: Any = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)

    def load(self) -> "LocalModel":
        from .engine.gate import DecodeGate
        from .registry import load_registry
        from .serving.generation import build_generation

        spec = load_registry(self.settings).resolve(self.model)
        self.generation = build_generation(spec, self.settings.hub_config(), 1, DecodeGate(),
                                           self.backend)
        return self

    def generate(self, req: Any, emit: Emit) -> Stats:
        return self.loop.run_until_complete(self._generate(req, emit))

    async def _generate(self, req: Any, emit: Emit) -> Stats:
        from .core.events import Done, ErrorEvent, TextDelta
        from .errors import EngineFailure
        from .serving.handles import DecodeHandles

        started = time.perf_counter()
        run = DecodeHandles.take(self.generation).start(req)
        stats, first = Stats(prompt_tokens=run.prompt_tokens), None
        async for event in run.events():
            if first is None and isinstance(event, (TextDelta, Done)):
                first = time.perf_counter()
            if isinstance(event, TextDelta):
                emit(event.text)
            elif isinstance(event, ErrorEvent):
                raise EngineFailure(event.message)
            elif isinstance(event, Done):
                stats.completion_tokens = event.usage.completion_tokens
        end = time.perf_counter()
        stats.prompt_s = (first or end) - started
        stats.decode_s = end - (first or end)
        return stats

    def close(self) -> None:
        if self.generation is not None and self.generation.engine is not None:
            self.generation.engine.shutdown(1.0)
        self.loop.close()


def _sampling(args: argparse.Namespace) -> Any:
    from .core.request import SamplingParams

    return SamplingParams(temperature=args.temp, top_p=args.top_p, seed=args.seed)


def generate_command(settings: Settings, args: argparse.Namespace) -> int:
    # may re-exec with OpenBLAS, so before anything loads MLX (backend/select.py rule 3)
    backend = select_backend(settings.backend_config(), argv=sys.argv, environ=environ_snapshot())
    from .core.request import GenRequest, Message

    local = LocalModel(settings, args.model, backend).load()
    try:
        req = GenRequest(model=args.model or "default", max_tokens=args.max_tokens,
                         sampling=_sampling(args))
        if args.no_chat_template:
            req.prompt = args.prompt
        else:
            req.messages = [Message("user", args.prompt)]
        stats = local.generate(req, _write)
        _write("\n")
        print(stats.report(), file=sys.stderr)
    finally:
        local.close()
    return 0


# --- over HTTP -------------------------------------------------------------------

def _auth_headers(settings: Settings) -> dict[str, str]:
    try:
        from .http.security import resolve_api_key

        key = resolve_api_key(settings)
    except Exception:  # noqa: BLE001 - no key file: talk without one
        key = settings.api_key
    return {"authorization": f"Bearer {key}"} if key else {}


@dataclass
class RemoteChat:
    url: str
    headers: dict[str, str]
    args: argparse.Namespace

    def stream(self, messages: Messages) -> Iterator[str]:
        import httpx

        body = {"model": self.args.model or "default", "messages": messages, "stream": True,
                "max_tokens": self.args.max_tokens, "temperature": self.args.temp,
                "top_p": self.args.top_p}
        if self.args.seed is not None:
            body["seed"] = self.args.seed
        with httpx.stream("POST", self.url + "/v1/chat/completions", json=body,
                          headers=self.headers, timeout=None) as r:
            if r.status_code != 200:
                r.read()
                raise RuntimeError(r.json().get("error", {}).get("message", r.text))
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"].get("message"))
                for choice in chunk.get("choices", []):
                    text = choice.get("delta", {}).get("content")
                    if text:
                        yield text


@dataclass
class LocalChat:
    local: LocalModel
    args: argparse.Namespace

    def stream(self, messages: Messages) -> Iterator[str]:
        from .core.request import GenRequest, Message

        req = GenRequest(model=self.args.model or "default", max_tokens=self.args.max_tokens,
                         sampling=_sampling(self.args),
                         messages=[Message(m["role"], m["content"]) for m in messages])  # type: ignore[arg-type]
        pieces: list[str] = []
        self.local.generate(req, pieces.append)
        yield from pieces


def _read_line(prompt: str) -> str | None:
    try:
        return input(prompt)
    except EOFError:
        return None


def repl(backend: Any, system: str | None) -> int:
    """The loop: read, stream the answer, remember both turns."""
    base: Messages = [{"role": "system", "content": system}] if system else []
    history: Messages = list(base)
    print("Type /reset to forget the conversation, /exit to quit.", flush=True)
    while True:
        line = _read_line(">> ")
        if line is None or line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history = list(base)
            print("[history cleared]", flush=True)
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        reply: list[str] = []
        try:
            for text in backend.stream(history):
                reply.append(text)
                _write(text)
        except (RuntimeError, OSError) as exc:
            history.pop()
            print(f"\n[error: {exc}]", flush=True)
            continue
        _write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})


def chat_command(settings: Settings, args: argparse.Namespace) -> int:
    url, headers = daemon_url(settings, args), _auth_headers(settings)
    if not args.local and daemon_answers(url, headers):
        print(f"[talking to the daemon at {url}]", flush=True)
        return repl(RemoteChat(url, headers, args), args.system)
    # may re-exec with OpenBLAS, so before anything loads MLX (backend/select.py rule 3)
    backend = select_backend(settings.backend_config(), argv=sys.argv, environ=environ_snapshot())
    print("[no daemon answered; loading the model in process]", flush=True)
    local = LocalModel(settings, args.model, backend).load()
    try:
        return repl(LocalChat(local, args), args.system)
    finally:
        local.close()
