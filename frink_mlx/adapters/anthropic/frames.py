"""Anthropic Messages: the neutral event stream -> Messages frames and the final message.

`MessageBuilder` serves the streaming and the plain path, so both always agree.

Rules:
1. Blocks open in event order; a change of kind closes the open block. A
   thinking block closes with a `signature_delta`; the signature is a digest of
   the thinking text (a local model has nothing to sign with; clients only echo it).
2. With `thinking.display: "omitted"` (translate rule 5) a thinking block is sent
   as Anthropic sends it then: opened and closed with empty `thinking` text, its
   signature the only delta. The model still thinks; the tokens count in
   `output_tokens`, and the signature is the digest of the text nobody was shown.
3. `stop_reason`: eos -> end_turn, stop string -> stop_sequence (+ the string),
   length -> max_tokens, tool call -> tool_use.
4. `usage.input_tokens` counts the prompt tokens that were not read from the
   prefix cache; those are `cache_read_input_tokens` (Anthropic's split).
"""

from __future__ import annotations

import hashlib
import json
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

Frame = tuple[str, dict[str, Any]]   # (SSE event name, payload)


def usage_dict(usage: Usage) -> dict[str, int]:
    out = {"input_tokens": max(0, usage.prompt_tokens - usage.cached_tokens),
           "output_tokens": usage.completion_tokens,
           "cache_read_input_tokens": usage.cached_tokens,
           "cache_creation_input_tokens": 0}
    if usage.draft_tokens is not None:  # wire.py rule 5
        out["draft_tokens"] = usage.draft_tokens
        out["draft_accepted"] = usage.draft_accepted or 0
    return out


def stop_reason(done: Done) -> tuple[str, str | None]:
    if done.finish_reason == "tool_calls":
        return "tool_use", None
    if done.finish_reason == "length":
        return "max_tokens", None
    if done.stop_kind == "stop_sequence":
        return "stop_sequence", done.stop_sequence
    return "end_turn", None


def thinking_signature(text: str) -> str:
    return "frink-sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(slots=True)
class MessageBuilder:
    """Events of one choice -> Anthropic stream frames, and the final message (rule 1)."""

    id: str
    model: str
    prompt_tokens: int = 0
    show_thinking: bool = True            # False: thinking.display "omitted" (rule 2)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    _open: str | None = None              # "text" | "thinking" | "tool_use"
    _hidden: str = ""                     # the open thinking block's text, when not shown
    _call_block: dict[int, int] = field(default_factory=dict)   # call_index -> block index
    done: Done | None = None

    def start(self) -> list[Frame]:
        message = self._message_base()
        message["usage"] = {"input_tokens": self.prompt_tokens, "output_tokens": 0}
        return [("message_start", {"type": "message_start", "message": message}),
                ("ping", {"type": "ping"})]

    def feed(self, event: Event) -> list[Frame]:
        if isinstance(event, TextDelta):
            return self._delta("text", "text_delta", "text", event.text) if event.text else []
        if isinstance(event, ReasoningDelta):
            if self.show_thinking:
                return self._delta("thinking", "thinking_delta", "thinking", event.text)
            frames = [] if self._open == "thinking" else self._close() + self._open_block(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._hidden += event.text
            return frames
        if isinstance(event, ToolCallStart):
            frames = self._close()
            block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
            return frames + self._open_block("tool_use", block, call_index=event.call_index)
        if isinstance(event, ToolCallDelta):
            index = self._call_block[event.call_index]
            return [("content_block_delta", {"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": event.arguments}})]
        if isinstance(event, ToolCallEnd):
            self.blocks[self._call_block[event.call_index]]["input"] = _tool_input(event.arguments)
            return self._close()
        if isinstance(event, Done):
            return self._finish(event)
        if isinstance(event, ErrorEvent):
            return [("error", error_payload(event.message, event.status))]
        return []

    def end(self) -> list[Frame]:
        return []   # message_stop went out with Done

    def result(self) -> dict[str, Any]:
        """The complete Message object (after Done)."""
        out = self._message_base()
        out["content"] = self.blocks
        if self.done is not None:
            out["stop_reason"], out["stop_sequence"] = stop_reason(self.done)
            out["usage"] = usage_dict(self.done.usage)
        return out

    def _message_base(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": None, "stop_sequence": None}

    def _delta(self, kind: str, delta_type: str, key: str, text: str) -> list[Frame]:
        frames: list[Frame] = []
        if self._open != kind:
            frames += self._close()
            frames += self._open_block(kind, {"type": kind, key: ""} if kind == "text"
                                       else {"type": kind, key: "", "signature": ""})
        index = len(self.blocks) - 1
        self.blocks[index][key] += text
        frames.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": {"type": delta_type, key: text}}))
        return frames

    def _open_block(self, kind: str, block: dict[str, Any], call_index: int | None = None
                    ) -> list[Frame]:
        self.blocks.append(block)
        self._open = kind
        index = len(self.blocks) - 1
        if call_index is not None:
            self._call_block[call_index] = index
        return [("content_block_start", {"type": "content_block_start", "index": index,
                                         "content_block": dict(block)})]

    def _close(self) -> list[Frame]:
        if self._open is None:
            return []
        index = len(self.blocks) - 1
        frames: list[Frame] = []
        if self._open == "thinking":
            signature = thinking_signature(self.blocks[index]["thinking"] + self._hidden)
            self._hidden = ""
            self.blocks[index]["signature"] = signature
            frames.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": signature}}))
        self._open = None
        return frames + [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _finish(self, done: Done) -> list[Frame]:
        self.done = done
        frames = self._close()
        reason, sequence = stop_reason(done)
        frames.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": usage_dict(done.usage)}))
        frames.append(("message_stop", {"type": "message_stop"}))
        return frames


_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}


def error_payload(message: str, status: int) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}
