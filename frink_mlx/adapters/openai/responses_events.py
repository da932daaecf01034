"""Neutral events -> OpenAI Responses stream events and the final Response object.

One `ResponseBuilder` per request serves both the streaming and the plain path,
so the streamed events always add up to the object a GET returns. Rules:
1. Every event carries `type` and a `sequence_number` counting from 0.
2. The stream opens with `response.created` then `response.in_progress`, and
   ends with exactly one of `response.completed`, `response.incomplete`
   (`incomplete_details.reason` = "max_output_tokens" when the length ran out)
   or `response.failed` (`error`).
3. Output items open in event order; a change of kind closes the open one:
   reasoning -> a `reasoning` item with one `reasoning_text` part; text -> a
   `message` item with one `output_text` part; each tool call -> its own
   `function_call` item (with `namespace` for a namespace member), or a
   `custom_tool_call` item for a custom tool (responses_tools.py). Opening:
   `output_item.added` (+ `content_part.added`); closing: `*.done` events,
   `content_part.done`, `output_item.done`.
   A custom call's `input` is streamed as one `custom_tool_call_input.delta`
   when the call ends (the model writes it JSON-escaped), then `.done`.
4. Usage: `input_tokens` is the whole prompt with `cached_tokens` as a detail
   (OpenAI's split, unlike Anthropic's).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ...core.events import (
    Done,
    ErrorEvent,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from .responses_tools import Offered, custom_input


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
            "total_tokens": usage.total_tokens}


@dataclass(slots=True)
class ResponseBuilder:
    """`base` holds the echoed request fields (id, model, instructions, tools, ...)."""

    base: dict[str, Any]
    output: list[dict[str, Any]] = field(default_factory=list)
    status: str = "in_progress"
    usage: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    incomplete_reason: str | None = None
    saw_tool_call: bool = False
    _seq: int = 0
    tools: Offered = field(default_factory=Offered)  # how calls are named (responses_tools)
    _open: str | None = None        # "message" | "reasoning" | "function_call" | "custom_tool_call"
    _calls: dict[int, int] = field(default_factory=dict)   # call_index -> output index

    def response(self) -> dict[str, Any]:
        return {**self.base, "status": self.status, "output": self.output, "usage": self.usage,
                "error": self.error,
                "incomplete_details": ({"reason": self.incomplete_reason}
                                       if self.incomplete_reason else None)}

    def result(self) -> dict[str, Any]:
        """The collected body: the Response object as it stands."""
        return self.response()

    def end(self) -> list[dict[str, Any]]:
        return []   # response.completed / failed / incomplete went out with Done

    def start(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=_copy(self.response())),
                self._event("response.in_progress", response=_copy(self.response()))]

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            return self._text("message", "output_text", "response.output_text.delta", event.text)
        if isinstance(event, ReasoningDelta):
            return self._text("reasoning", "reasoning_text", "response.reasoning_text.delta",
                              event.text)
        if isinstance(event, ToolCallStart):
            out = self._close()
            item = self.tools.output_item({
                "id": new_id("fc"), "type": "function_call", "status": "in_progress",
                "call_id": event.id, "name": event.name, "arguments": ""})
            self._calls[event.call_index] = len(self.output)
            self.saw_tool_call = True
            return out + self._add_item(item["type"], item)
        if isinstance(event, ToolCallDelta):
            index = self._calls[event.call_index]
            if self.output[index]["type"] == "custom_tool_call":
                return []   # rule 3: the input string is known once the call ends
            self.output[index]["arguments"] += event.arguments
            return [self._event("response.function_call_arguments.delta",
                                item_id=self.output[index]["id"], output_index=index,
                                delta=event.arguments)]
        if isinstance(event, ToolCallEnd):
            item = self.output[self._calls[event.call_index]]
            if item["type"] == "custom_tool_call":
                item["input"] = custom_input(event.arguments)
            else:
                item["arguments"] = event.arguments
            return self._close()
        if isinstance(event, Done):
            return self._finish(event)
        if isinstance(event, ErrorEvent):
            return self.fail(event.message)
        return []

    def fail(self, message: str) -> list[dict[str, Any]]:
        out = self._close()
        self.status = "failed"
        self.error = {"code": "server_error", "message": message}
        return out + [self._event("response.failed", response=_copy(self.response()))]

    # -- items -----------------------------------------------------------
    def _event(self, kind: str, **payload: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        return event

    def _add_item(self, kind: str, item: dict[str, Any]) -> list[dict[str, Any]]:
        self.output.append(item)
        self._open = kind
        return [self._event("response.output_item.added", output_index=len(self.output) - 1,
                            item=_copy(item))]

    def _text(self, kind: str, part_type: str, delta_type: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out: list[dict[str, Any]] = []
        if self._open != kind:
            out += self._close()
            item: dict[str, Any]
            if kind == "message":
                item = {"id": new_id("msg"), "type": "message", "status": "in_progress",
                        "role": "assistant", "content": []}
            else:
                item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": []}
            out += self._add_item(kind, item)
            part = _part(part_type)
            item["content"].append(part)
            out.append(self._event("response.content_part.added", item_id=item["id"],
                                   output_index=len(self.output) - 1, content_index=0,
                                   part=_copy(part)))
        index = len(self.output) - 1
        item = self.output[index]
        item["content"][0]["text"] += text
        extra: dict[str, Any] = {"logprobs": []} if kind == "message" else {}
        out.append(self._event(delta_type, item_id=item["id"], output_index=index,
                               content_index=0, delta=text, **extra))
        return out

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        index = len(self.output) - 1
        item = self.output[index]
        out: list[dict[str, Any]] = []
        if self._open == "function_call":
            out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                   output_index=index, name=item["name"],
                                   arguments=item["arguments"]))
        elif self._open == "custom_tool_call":
            out.append(self._event("response.custom_tool_call_input.delta", item_id=item["id"],
                                   output_index=index, delta=item["input"]))
            out.append(self._event("response.custom_tool_call_input.done", item_id=item["id"],
                                   output_index=index, input=item["input"]))
        else:
            part = item["content"][0]
            done_type = ("response.output_text.done" if self._open == "message"
                         else "response.reasoning_text.done")
            extra: dict[str, Any] = {"logprobs": []} if self._open == "message" else {}
            out.append(self._event(done_type, item_id=item["id"], output_index=index,
                                   content_index=0, text=part["text"], **extra))
            out.append(self._event("response.content_part.done", item_id=item["id"],
                                   output_index=index, content_index=0, part=_copy(part)))
        if "status" in item or self._open != "reasoning":
            item["status"] = "completed"
        self._open = None
        out.append(self._event("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def _finish(self, done: Done) -> list[dict[str, Any]]:
        out = self._close()
        self.usage = usage_dict(done.usage)
        if done.finish_reason == "length":
            self.status, self.incomplete_reason = "incomplete", "max_output_tokens"
            return out + [self._event("response.incomplete", response=_copy(self.response()))]
        self.status = "completed"
        return out + [self._event("response.completed", response=_copy(self.response()))]


def _part(part_type: str) -> dict[str, Any]:
    if part_type == "output_text":
        return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return {"type": part_type, "text": ""}


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    """A snapshot: later deltas must not change an event already built."""
    return {k: ([_copy(x) if isinstance(x, dict) else x for x in v] if isinstance(v, list)
                else _copy(v) if isinstance(v, dict) else v) for k, v in obj.items()}


def created_now() -> int:
    return int(time.time())
