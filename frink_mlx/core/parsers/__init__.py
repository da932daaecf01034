"""Streaming output parsers: model text -> reasoning / text / tool-call events.

core/output.py detokenizes the engine's ids into text and feeds it, chunk by
chunk, to one `StreamParser` per choice, built by `build_parser`. The parser
splits `<think>`-style reasoning and the model family's tool-call markup out of
the text, so markup never leaks into `TextDelta`s (stream.py states the rules;
tool_formats.py and xml_formats.py the families; calls.py what they share).
gpt-oss's Harmony messages are a structure of their own: harmony.py.

`MarkupInfo` is what the engine side knows about the model's markers (from
mlx-lm's TokenizerWrapper: `think_start`/`think_end`, `tool_call_start`/
`tool_call_end`, and the tool parser's module name as `tool_format`), passed
down as plain data so core imports no MLX.

Choices made here:
1. With no think markers known, `<think>`/`</think>` are still recognised -- but
   only as a block at the very start of a reply, where they cannot be prose.
2. A `tool_format` we have no body parser for (mlx-lm knows a few families we
   do not implement: pythonic, longcat, ...) still has its markers cut out of the text when
   `tool_call_start` is known; its bodies are tried as Hermes JSON and dropped if
   they do not parse, rather than leaking markup.
3. A model with no known tool format that is offered tools gets the Hermes
   `<tool_call>` parser: it is what small instruct models (SmolLM2, Qwen, many
   fine-tunes) are trained to write, and the tag is never prose.
4. `tool_format` "harmony" (gpt-oss, named by `detect_format` from its
   template) gets the Harmony parser whether or not tools were offered: its
   channels carry the reasoning and the answer too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..events import Event, TextDelta
from ..request import GenRequest
from .calls import allowed_tool_names
from .harmony import HarmonyStreamParser
from .stream import MarkupStreamParser
from .tool_formats import FORMATS, HARMONY, ToolFormat, detect_format, parse_json_tools

__all__ = ["MarkupInfo", "StreamParser", "PassthroughParser", "MarkupStreamParser",
           "HarmonyStreamParser", "build_parser", "detect_format", "allowed_tool_names",
           "HARMONY"]

DEFAULT_THINK = ("<think>", "</think>")


@dataclass(slots=True, frozen=True)
class MarkupInfo:
    think_start: str | None = None
    think_end: str | None = None
    tool_call_start: str | None = None
    tool_call_end: str | None = None
    tool_format: str | None = None          # e.g. "json_tools" (Hermes/Qwen), "glm47", "harmony"
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
    """Plain text, no markup handling (raw completions: the text is the product)."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.saw_tool_call = False

    def feed(self, text: str) -> list[Event]:
        return [TextDelta(text, index=self.index)] if text else []

    def finish(self) -> list[Event]:
        return []


def tool_format_for(markup: MarkupInfo) -> ToolFormat | None:
    known = FORMATS.get(markup.tool_format or "")
    if known is not None:
        return known
    if markup.tool_call_start:
        return ToolFormat(markup.tool_format or "generic", markup.tool_call_start,
                          markup.tool_call_end or None, parse_json_tools)
    return None


def build_parser(markup: MarkupInfo, request: GenRequest, index: int = 0) -> StreamParser:
    """The parser for one choice of `request` on a model with `markup`.

    Raw-prompt requests (`request.messages is None`) get the passthrough parser:
    a completion continues the prompt's text, markup included.
    """
    if request.messages is None:
        return PassthroughParser(index)
    if markup.tool_format == HARMONY:   # choice 4
        return HarmonyStreamParser(request, index)
    think = (markup.think_start, markup.think_end) if markup.think_start and markup.think_end \
        else DEFAULT_THINK
    tool_format = tool_format_for(markup)
    if tool_format is None and request.tools:
        tool_format = FORMATS["json_tools"]  # choice 3
    return MarkupStreamParser(think=think, tool_format=tool_format, request=request,
                              prompt_opens_thinking=markup.prompt_opens_thinking, index=index)
