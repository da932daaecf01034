"""gpt-oss's Harmony output: channels and recipients -> reasoning, text and tool calls.

gpt-oss does not put markup inside one reply; it writes a sequence of messages
(openai/gpt-oss's chat template is the reference). The rendered prompt ends
with `<|start|>assistant`, so the reply starts inside a message header:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json
        <|message|>{"city": "Paris"}<|call|>                    (one line in the text)
    ...or...  <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

Rules:
1. A message is `[<|start|>ROLE] HEADER <|message|> BODY` and ends at `<|end|>`,
   `<|call|>` or `<|return|>` (or a new `<|start|>`, or the end of the reply:
   `<|call|>` and `<|return|>` are gpt-oss's stop tokens, so the text usually
   ends without them). The header names the channel (`<|channel|>NAME`) and
   may name a recipient (` to=functions.NAME`), before or after the channel;
   ` <|constrain|>json` and ` json` are ignored.
2. `analysis` -> ReasoningDelta; `final`, a `commentary` with no recipient (a
   preamble meant for the user) and any other channel -> TextDelta.
3. A message to `functions.NAME` is a call of NAME whose body is the JSON
   arguments: ToolCallStart goes out once the body's `{` is seen, the arguments
   stream as generated (trailing whitespace held), and the deltas concatenate
   to exactly `ToolCallEnd.arguments` (a call cut short ends with what was
   sent). A call of a tool that was not offered, a recipient other than
   `functions.*` (gpt-oss's built-in browser and python tools) and a body that
   neither opens with `{` nor is a JSON string holding an object are dropped,
   never text (calls.py rule 3 decides which calls go out).
4. A reply that does not begin like a header (a model that ignores Harmony,
   or output forced to JSON by a grammar) is text until a `<|start|>`.
5. Text that could be the start of a marker is held back until the next chunk
   decides it; an unfinished header at the end is dropped.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from ..events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd
from ..request import GenRequest
from .calls import arguments_text, safe_prefix_len
from .machine import StepMachine

START, MESSAGE = "<|start|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
HEADER_OPENERS = (START, "<|channel|>", " to=", "to=", "<|constrain|>")
MAX_HEADER_CHARS = 256

Mode = Literal["header", "body", "text"]
Kind = Literal["reasoning", "text", "call", "drop"]

_CHANNEL = re.compile(r"<\|channel\|>\s*([\w-]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _kind_of(header: str) -> tuple[Kind, str | None]:
    """Rules 2-3: what a message's body is, and the tool it calls."""
    recipient = _RECIPIENT.search(header)
    target = recipient.group(1) if recipient else None
    if target and target.startswith("functions."):
        return "call", target[len("functions."):]
    if target and target not in ("assistant", "user", "all"):
        return "drop", None
    channel = _CHANNEL.search(header)
    return ("reasoning" if channel and channel.group(1) == "analysis" else "text"), None


class HarmonyStreamParser(StepMachine):
    """The rules above, as modes of a StepMachine (machine.py)."""

    def __init__(self, request: GenRequest, index: int = 0) -> None:
        super().__init__(request, index)
        self._mode: Mode = "header"
        self._at_reply_start = True
        self._kind: Kind = "text"
        self._call_name: str | None = None
        self._call_index: int | None = None
        self._sent: list[str] = []   # argument pieces already streamed for the open call
        self._sent_len = 0
        self._lead = 0               # where the arguments begin in the body
        self._scan = 0           # where to look for the end of the body next

    # -- header / raw text ------------------------------------------------
    def _step_header(self, out: list[Event], final: bool) -> bool:
        pos = self._buf.find(MESSAGE)
        header = self._buf if pos < 0 else self._buf[:pos]
        if not self._could_be_header(header):   # rule 4
            self._mode = "text"
            return True
        if pos < 0:
            if final:
                self._buf = ""   # rule 5: an unfinished header is markup
            return False
        self._buf = self._buf[pos + len(MESSAGE):]
        self._at_reply_start = False
        self._kind, self._call_name = _kind_of(header)
        if self._kind == "call" and not self._book.may_call(self._call_name or ""):
            self._kind = "drop"
        self._call_index, self._sent, self._sent_len, self._mode = None, [], 0, "body"
        return True

    def _could_be_header(self, header: str) -> bool:
        if "\n" in header or len(header) > MAX_HEADER_CHARS:
            return False
        if not self._at_reply_start:
            return True
        return any(header.startswith(o) or o.startswith(header) for o in HEADER_OPENERS)

    def _step_text(self, out: list[Event], final: bool) -> bool:
        pos = self._buf.find(START)
        if pos >= 0:
            self._emit(out, TextDelta, self._buf[:pos])
            self._buf, self._mode, self._at_reply_start = self._buf[pos:], "header", False
            return True
        cut = len(self._buf) if final else safe_prefix_len(self._buf, [START])
        self._emit(out, TextDelta, self._buf[:cut])
        self._buf = self._buf[cut:]
        return False

    # -- message bodies ---------------------------------------------------
    def _step_body(self, out: list[Event], final: bool) -> bool:
        markers = (*ENDS, START)
        ends = [(at, m) for m in markers if (at := self._buf.find(m, self._scan)) >= 0]
        if ends:
            at, marker = min(ends)
            self._body_text(out, self._buf[:at], closed=True)
            self._buf = self._buf[at + (0 if marker == START else len(marker)):]
            self._mode, self._scan = "header", 0
            return True
        cut = len(self._buf) if final else safe_prefix_len(self._buf, [*ENDS, START])
        if final:
            self._body_text(out, self._buf, closed=True)
            self._buf = ""
            return False
        if self._kind == "call":   # the body stays whole until it closes
            self._stream_arguments(out, self._buf[:cut])
            self._scan = max(0, len(self._buf) - max(map(len, markers)) + 1)
        elif cut:
            self._body_text(out, self._buf[:cut], closed=False)
            self._buf = self._buf[cut:]
        return False

    def _body_text(self, out: list[Event], text: str, *, closed: bool) -> None:
        """Rule 2 for text and reasoning; rule 3 for calls (which keep their whole body)."""
        if self._kind == "reasoning":
            self._emit(out, ReasoningDelta, text)
        elif self._kind == "text":
            self._emit(out, TextDelta, text)
        elif self._kind == "call" and closed:
            self._close_call(out, text)

    def _stream_arguments(self, out: list[Event], body: str) -> None:
        """Rule 3: forward the body's new argument text, trailing whitespace held."""
        if self._call_index is None:
            lead = len(body) - len(body.lstrip())   # only whitespace has been seen so far
            if body[lead:lead + 1] != "{":
                return
            self._lead, self._call_index = lead, self._book.start(out, self._call_name or "")
        start = self._lead + self._sent_len
        end = len(body)
        while end > start and body[end - 1].isspace():
            end -= 1
        if end > start:
            out.append(ToolCallDelta(self._call_index, body[start:end], index=self.index))
            self._sent.append(body[start:end])
            self._sent_len = end - self._lead

    def _close_call(self, out: list[Event], body: str) -> None:
        self._stream_arguments(out, body)
        if self._call_index is None:   # never opened with `{`: maybe a JSON string of one
            try:
                arguments = arguments_text(json.loads(body))
            except ValueError:
                return   # rule 3: not a JSON object, dropped
            call_index = self._book.start(out, self._call_name or "")
            out.append(ToolCallDelta(call_index, arguments, index=self.index))
            out.append(ToolCallEnd(call_index, arguments, index=self.index))
            return
        out.append(ToolCallEnd(self._call_index, "".join(self._sent), index=self.index))
        self._call_index = None

    def _emit(self, out: list[Event], kind: type[TextDelta] | type[ReasoningDelta],
              text: str) -> None:
        if text:
            out.append(kind(text, index=self.index))
