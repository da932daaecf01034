"""What the CLI front ends share: sampling parameters, speed figures, the ChatModel protocol.

Both kinds of ChatModel (the daemon over HTTP, a model loaded in process) stream an
answer through the same `emit` callback and return the same `Stats`, so the
REPL and `generate` never ask which one they talk to. Rules:
1. `answer()` may raise KeyboardInterrupt (Ctrl-C): the request is stopped
   (the stream closed, or the in-process run cancelled and its rows aborted)
   before it propagates; what was emitted so far is the caller's.
2. Failures are FrinkErrors (errors.py) with one-line messages; transport
   failures are `Unavailable` with code DAEMON_UNREACHABLE (nothing was
   answered) or DAEMON_LOST (the connection broke mid-answer).
3. Speed is reported the way `mlx_lm.generate` does: prompt tokens over the
   time to the first token, and (completion tokens - 1) over the time after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

Messages = list[dict[str, str]]
Emit = Callable[[str], None]
Note = Callable[[str], None]

DAEMON_UNREACHABLE = "daemon_unreachable"
DAEMON_LOST = "daemon_lost"


@dataclass(slots=True)
class ChatParams:
    """What the user asked for on the command line (None: the model's default)."""

    model: str | None
    max_tokens: int
    temperature: float | None
    top_p: float | None
    seed: int | None


@dataclass(slots=True)
class Stats:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_s: float = 0.0          # request start -> first token (prefill + queueing)
    decode_s: float = 0.0          # first token -> last
    cached_tokens: int | None = None
    peak_memory_gb: float | None = None   # in-process only

    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    def decode_tps(self) -> float:
        if self.decode_s <= 0 or self.completion_tokens <= 1:
            return 0.0
        return (self.completion_tokens - 1) / self.decode_s

    def report(self) -> str:
        """mlx_lm.generate's block, for `generate` on stderr."""
        generation = (f"Generation: {self.completion_tokens} tokens, "
                      f"{self.decode_tps():.3f} tokens-per-sec")
        lines = ["==========",
                 f"Prompt: {self.prompt_tokens} tokens, {self.prompt_tps():.3f} tokens-per-sec",
                 generation]
        if self.peak_memory_gb is not None:
            lines.append(f"Peak memory: {self.peak_memory_gb:.3f} GB")
        return "\n".join(lines)

    def line(self) -> str:
        """One line for the REPL (`/stats`, `--verbose`)."""
        cached = f", {self.cached_tokens} cached" if self.cached_tokens else ""
        return (f"[prompt: {self.prompt_tokens} tokens{cached}, {self.prompt_tps():.1f} tok/s"
                f" | answer: {self.completion_tokens} tokens, {self.decode_tps():.1f} tok/s"
                f" | first token after {self.prompt_s:.2f} s]")


class ChatModel(Protocol):
    """A model to talk to: the daemon over HTTP or one loaded in process."""

    @property
    def label(self) -> str: ...   # "the daemon at http://..." / "in process"

    @property
    def model(self) -> str: ...   # the name requests use now

    def answer(self, messages: Messages, params: ChatParams, emit: Emit) -> Stats: ...

    def complete(self, prompt: str, params: ChatParams, emit: Emit) -> Stats: ...

    def switch_model(self, name: str) -> str: ...

    def close(self) -> None: ...
