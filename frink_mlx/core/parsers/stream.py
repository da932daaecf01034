"""The markup-aware stream parser: reasoning, text and tool calls out of one text stream.

Rules, in the order they apply to one reply:
1. Reasoning is a block at the very start of the reply, `think_start ... think_end`
   (leading whitespace allowed), or -- when the rendered prompt already opened the
   block (`MarkupInfo.prompt_opens_thinking`) -- everything up to `think_end`.
   A think marker anywhere else is plain text. Whitespace right after the block
   is dropped (models put "\n\n" there).
2. Tool calls are the family's markers (tool_formats.py). Everything between the
   markers becomes ToolCallStart / ToolCallDelta* / ToolCallEnd; a call to a tool
   that was not offered (or any call when tool_choice is "none") is dropped, markup
   and all. A body that does not parse is dropped too: never leaked as text.
3. Text that could be the beginning of a marker is held back until the next
   chunk decides it (or `finish` flushes it as what it turned out to be).
4. For `json_tools` the arguments are forwarded as they are generated once
   `{"name": "...", "arguments": ` has been seen; the deltas concatenate to
   exactly `ToolCallEnd.arguments`. Other families emit one delta at the end.
5. With `parallel_tool_calls` off, calls after the first are dropped like calls
   to tools that were not offered.
6. A call cut short (the length limit inside its markup) ends with what its
   body holds, minus any beginning of the end marker: `arguments` never carry
   markup (`...}}\n</tool_call` becomes the call's complete arguments).
7. A family's `after_call` marker (Gemma 4's `<|tool_response>`) right after a
   call is dropped with the whitespace there; anywhere else it is text.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from ..events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd
from ..request import GenRequest
from .calls import allowed_tool_names, safe_prefix_len
from .machine import StepMachine
from .tool_formats import ToolFormat

__all__ = ["MarkupStreamParser", "allowed_tool_names", "safe_prefix_len"]

Mode = Literal["start", "reasoning", "text", "tool", "tool_tail"]

_JSON_CALL_HEAD = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


class _OpenCall:
    """A tool call whose markup has opened but not closed."""

    __slots__ = ("call_index", "started", "dropped", "sent_len", "head_end", "guessed", "scan")

    def __init__(self, guessed: bool = False) -> None:
        self.guessed = guessed               # opened by a reply-start guess, not a marker
        self.call_index: int | None = None   # set once ToolCallStart went out
        self.started = False
        self.dropped = False
        self.sent_len = 0                    # arguments text already streamed (from head_end)
        self.scan = 0                        # where to look for the end marker next
        self.head_end = 0                    # where the arguments begin in the body


class MarkupStreamParser(StepMachine):
    """The rules above, as modes of a StepMachine (machine.py)."""

    def __init__(self, *, think: tuple[str, str] | None, tool_format: ToolFormat | None,
                 request: GenRequest, prompt_opens_thinking: bool, index: int = 0) -> None:
        super().__init__(request, index)
        self._think = think
        self._fmt = tool_format
        self._reply_start: tuple[str, ...] = ()
        if tool_format and self._book.allowed and request.response_format is None:
            self._reply_start = tool_format.reply_start
        self._mode: Mode = "reasoning" if (think and prompt_opens_thinking) else "start"
        self._thought = self._mode == "reasoning"
        self._skip_ws = False
        self._call: _OpenCall | None = None

    def _step_start(self, out: list[Event], final: bool) -> bool:
        """Before any text: decide between a think block, a reply-start call and text."""
        stripped = self._buf.lstrip()
        if not stripped:
            if final:
                self._buf = "" if self._thought else self._buf
                self._mode = "text"
                return bool(self._buf)
            return False
        candidates = list(self._reply_start)
        if self._think and not self._thought:
            candidates.append(self._think[0])
        for marker in candidates:
            if stripped.startswith(marker):
                if self._think and marker == self._think[0] and not self._thought:
                    self._buf, self._mode, self._thought = stripped[len(marker):], "reasoning", True
                else:
                    self._buf, self._mode = stripped, "tool_tail"
                    self._call = _OpenCall(guessed=True)
                return True
        if not final and any(marker.startswith(stripped) for marker in candidates):
            return False  # could still become one of the markers
        if self._thought:
            self._buf = stripped
        self._mode = "text"
        return True

    def _step_reasoning(self, out: list[Event], final: bool) -> bool:
        assert self._think is not None
        end = self._think[1]
        pos = self._buf.find(end)
        if pos >= 0:
            self._emit(out, ReasoningDelta, self._buf[:pos])
            self._buf, self._mode = self._buf[pos + len(end):], "start"
            return True
        cut = len(self._buf) if final else safe_prefix_len(self._buf, [end])
        self._emit(out, ReasoningDelta, self._buf[:cut])
        self._buf = self._buf[cut:]
        return False

    def _step_text(self, out: list[Event], final: bool) -> bool:
        if self._skip_ws:
            self._buf = self._buf.lstrip()
            trailer = self._fmt.after_call if self._fmt else None
            if trailer and self._buf.startswith(trailer):  # rule 7
                self._buf = self._buf[len(trailer):]
                return True
            if not self._buf:
                return False
            if trailer and trailer.startswith(self._buf):   # rule 7, maybe not whole yet
                if final:
                    self._buf = ""
                return False
            self._skip_ws = False
        start = self._fmt.start if self._fmt else None
        pos = self._buf.find(start) if start else -1
        if start and pos >= 0:
            self._emit(out, TextDelta, self._buf[:pos])
            self._buf = self._buf[pos + len(start):]
            self._mode = "tool" if self._fmt and self._fmt.end else "tool_tail"
            self._call = _OpenCall()
            return True
        cut = len(self._buf) if final or not start else safe_prefix_len(self._buf, [start])
        self._emit(out, TextDelta, self._buf[:cut])
        self._buf = self._buf[cut:]
        return False

    def _step_tool(self, out: list[Event], final: bool) -> bool:
        assert self._fmt is not None and self._fmt.end and self._call is not None
        end = self._fmt.end
        pos = self._buf.find(end, self._call.scan)  # rescanning would be quadratic in the call
        if pos >= 0:
            self._close_call(out, self._buf[:pos])
            self._buf = self._buf[pos + len(self._fmt.end):]
            self._mode, self._skip_ws = "text", True
            return True
        if final:  # rule 6: a call cut short keeps no half of its end marker
            self._close_call(out, self._buf[:safe_prefix_len(self._buf, [end])])
            self._buf = ""
            return False
        self._call.scan = max(0, len(self._buf) - len(end) + 1)
        if self._fmt.streams_arguments:
            self._stream_arguments(out, self._call, self._buf,
                                   safe_prefix_len(self._buf, [end]))
        return False

    def _step_tool_tail(self, out: list[Event], final: bool) -> bool:
        if final:
            self._close_call(out, self._buf)
            self._buf = ""
        return False

    # -- tool calls ------------------------------------------------------
    def _stream_arguments(self, out: list[Event], call: _OpenCall, body: str,
                          limit: int | None = None) -> None:
        """Forward `body[:limit]`'s new argument text, minus a maybe-closing brace."""
        if call.dropped:
            return
        if not call.started:
            head = _JSON_CALL_HEAD.match(body)
            if head is None:
                return
            name = json.loads(f'"{head.group(1)}"')
            call.started, call.head_end = True, head.end()
            if not self._may_call(name):
                call.dropped = True
                return
            call.call_index = self._start_call(out, name)
        start = call.head_end + call.sent_len
        safe_end = _without_outer_close(body, len(body) if limit is None else limit)
        if safe_end > start:
            out.append(ToolCallDelta(call.call_index or 0, body[start:safe_end], index=self.index))
            call.sent_len = safe_end - call.head_end

    def _close_call(self, out: list[Event], body: str) -> None:
        call, self._call = self._call, None
        assert call is not None and self._fmt is not None
        if self._fmt.streams_arguments:
            self._stream_arguments(out, call, body)
        try:
            parsed = self._fmt.parse(body, self._book.schemas)
        except (ValueError, json.JSONDecodeError):
            if call.guessed:  # it was not a call after all: the reply is text
                self._emit(out, TextDelta, body)
                return
            parsed = []
        if call.call_index is not None:  # already streaming: finish this one
            sent = body[call.head_end:call.head_end + call.sent_len]
            raw = body[call.head_end:_without_outer_close(body, len(body))]
            arguments = raw if _same_json(raw, parsed[0][1] if parsed else None) else sent
            if len(arguments) > len(sent) and arguments.startswith(sent):
                out.append(ToolCallDelta(call.call_index, arguments[len(sent):],
                                         index=self.index))
            out.append(ToolCallEnd(call.call_index, arguments, index=self.index))
            parsed = parsed[1:]
        elif call.dropped:
            parsed = parsed[1:]
        for name, arguments in parsed:
            if not self._may_call(name):
                continue
            call_index = self._start_call(out, name)
            out.append(ToolCallDelta(call_index, arguments, index=self.index))
            out.append(ToolCallEnd(call_index, arguments, index=self.index))

    def _may_call(self, name: str) -> bool:
        """Rule 2, and rule 5's one-call limit."""
        return self._book.may_call(name)

    def _start_call(self, out: list[Event], name: str) -> int:
        return self._book.start(out, name)

    def _emit(self, out: list[Event], kind: type[TextDelta] | type[ReasoningDelta],
              text: str) -> None:
        if text:
            out.append(kind(text, index=self.index))


def _without_outer_close(text: str, end: int) -> int:
    """`end` moved back over a trailing `ws } ws` (maybe the call object's own brace)."""
    while end and text[end - 1].isspace():
        end -= 1
    if end and text[end - 1] == "}":
        end -= 1
        while end and text[end - 1].isspace():
            end -= 1
    return end


def _same_json(a: str, b: str | None) -> bool:
    if b is None:
        return False
    try:
        return bool(json.loads(a) == json.loads(b))
    except json.JSONDecodeError:
        return False
