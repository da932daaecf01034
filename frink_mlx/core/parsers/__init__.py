"""Streaming output parsers: model text -> reasoning / text / tool-call events.

core/output.py detokenizes the engine's ids into text and feeds it, chunk by
chunk, to one `StreamParser` per choice, built by `build_parser`. The parser
splits `<think>`-style reasoning and the model family's tool-call markup out of
the text, so markup never leaks into `TextDelta`s.

`MarkupInfo` is what the engine side knows about the model's markers (from
mlx-lm's TokenizerWrapper), passed down as plain data so core imports no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..events import Event, TextDelta
from ..request import GenRequest


@dataclass(slots=True, frozen=True)
class MarkupInfo:
    think_start: str | None = None
    think_end: str | None = None
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    tool_format: str | None = None          # e.g. "json_tools" (Hermes/Qwen), "mistral", "llama3_json"
    prompt_opens_thinking: bool = False     # the rendered prompt ends inside an open think block


class StreamParser(Protocol):
    def feed(self, text: str) -> list[Event]:
        """Consume the next decoded text chunk; return the events it completes."""

    def finish(self) -> list[Event]:
        """End of generation: flush whatever is held back."""

    @property
    def saw_tool_call(self) -> bool:
        """Whether any tool call was emitted (finish reason becomes tool_calls)."""


class PassthroughParser:
    """Plain text, no markup handling."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.saw_tool_call = False

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text, index=self.index)] if text else []

    def finish(self) -> list[Event]:
        return []


def build_parser(markup: MarkupInfo, request: GenRequest, index: int = 0) -> StreamParser:
    """The parser for one choice of `request` on a model with `markup`."""
    return PassthroughParser(index)
