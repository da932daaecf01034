"""Anthropic Messages <-> the neutral GenRequest / event stream. Pure functions, no I/O.

Request rules:
1. `system` (string or text blocks) becomes one leading system message; a
   `role: "system"` entry inside `messages` (Claude Code 2.1 sends them) becomes a
   system message where it stands. A system text block that is Claude Code's
   `x-anthropic-billing-header: cc_version=...; cch=<hash>;` line is dropped: it is
   client metadata for Anthropic's billing, not instructions, and its hash of the
   first prompt makes every session's prompt differ at its 47th character, so no
   session could reuse another's cached system prompt. The model never sees it
   (the prompt rendered, counted and cached is the one without it).
2. A user turn's `tool_result` blocks become `tool` messages (in order, before
   the turn's text), carrying `tool_call_id` and the tool's name looked up from
   the assistant `tool_use` that asked for it; `is_error` prefixes "Error: ".
3. An assistant turn's `thinking` goes back as `Message.reasoning`, `tool_use`
   as `ToolCall`s with the input re-serialised as JSON text.
4. Image blocks in user turns and tool results become a placeholder text
   (core/images.py). Document blocks and server tools are refused by name
   (`messages[2].content[0]`, `tools[1].type`, ...). `disable_parallel_tool_use`
   keeps only the model's first call (the parser drops the rest).
5. `thinking: enabled` -> GenRequest.thinking True + budget; `adaptive` -> True
   (the model decides how long); `disabled` -> False; absent -> None (the
   template's default). `thinking.display` "summarized" / "updates" is a no-op
   (the whole thinking is returned); "omitted" is refused by name.
   `output_config.effort` bounds the thinking: `low` -> 1,024 tokens, `medium` ->
   4,096, `high` / `xhigh` / `max` -> unbounded (the model decides), unless
   `thinking.budget_tokens` is given, which wins; with thinking disabled it is a
   no-op (there is no thinking to bound). `output_config.format` (JSON schema)
   becomes the structured-output constraint.
6. A conversation ending in an assistant turn is a prefill: the reply continues
   that text (the template renders it open, without its end-of-turn marker).

Response rules (`MessageBuilder`, shared by the streaming and the plain path,
so both always agree):
7. Blocks open in event order; a change of kind closes the open block. A
   thinking block closes with a `signature_delta`; the signature is a digest of
   the thinking text (a local model has nothing to sign with; clients only echo it).
8. `stop_reason`: eos -> end_turn, stop string -> stop_sequence (+ the string),
   length -> max_tokens, tool call -> tool_use.
9. `usage.input_tokens` counts the prompt tokens that were not read from the
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
from ...core.images import omit_image
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, Tool, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from . import wire

Frame = tuple[str, dict[str, Any]]   # (SSE event name, payload)


# -- request -------------------------------------------------------------------
BILLING_HEADER = "x-anthropic-billing-header:"      # rule 1
EFFORT_BUDGET_TOKENS = {"low": 1024, "medium": 4096}    # rule 5; others: unbounded


def _system_text(blocks: str | list[Any], where: str) -> str:
    """A system prompt's text without Claude Code's billing-header block (rule 1)."""
    if isinstance(blocks, str):
        return "" if blocks.startswith(BILLING_HEADER) else blocks
    return _text_of([b for b in blocks if not (isinstance(b, wire.TextBlock)
                                               and b.text.startswith(BILLING_HEADER))], where)


def _text_of(blocks: str | list[Any], where: str, omitted: list[str] | None = None) -> str:
    """Blocks' text; with `omitted`, an image block becomes the placeholder text
    (core/images.py rule 1), else it is refused naming it."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, block in enumerate(blocks):
        if omitted is not None and isinstance(block, wire.ImageBlock):
            parts.append(omit_image(f"{where}[{j}]", omitted))
            continue
        if not isinstance(block, wire.TextBlock):
            raise UnsupportedField(f"{where}[{j}]", f"is a '{_tag(block)}' block; this server "
                                   "serves text-only models")
        parts.append(block.text)
    return "\n".join(parts)


def _tag(block: Any) -> str:
    return str(type(block).__struct_config__.tag)


def _user_messages(blocks: list[wire.ContentBlock], i: int,
                   tool_names: dict[str, str], omitted: list[str]) -> list[Message]:
    tools: list[Message] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, wire.ToolResultBlock):
            content = _text_of(block.content, f"{where}.content", omitted)
            tools.append(Message("tool", ("Error: " + content) if block.is_error else content,
                                 tool_call_id=block.tool_use_id,
                                 name=tool_names.get(block.tool_use_id)))
        elif isinstance(block, wire.TextBlock):
            texts.append(block.text)
        elif isinstance(block, wire.ImageBlock):
            texts.append(omit_image(where, omitted))
        else:
            raise UnsupportedField(where, f"is a '{_tag(block)}' block, which a user turn "
                                   "cannot carry here")
    if texts:
        tools.append(Message("user", "\n".join(texts)))
    return tools


def _assistant_message(blocks: list[wire.ContentBlock], i: int,
                       tool_names: dict[str, str]) -> Message:
    message = Message("assistant")
    texts: list[str] = []
    for j, block in enumerate(blocks):
        if isinstance(block, wire.TextBlock):
            texts.append(block.text)
        elif isinstance(block, wire.ToolUseBlock):
            tool_names[block.id] = block.name
            message.tool_calls.append(ToolCall(block.id, block.name,
                                               json.dumps(block.input, ensure_ascii=False)))
        elif isinstance(block, wire.ThinkingBlock):
            message.reasoning = (message.reasoning or "") + block.thinking
        elif not isinstance(block, wire.RedactedThinkingBlock):  # opaque; nothing to replay
            raise UnsupportedField(f"messages[{i}].content[{j}]",
                                   f"is a '{_tag(block)}' block, which an assistant turn cannot "
                                   "carry here")
    message.content = "".join(texts)
    return message


def to_messages(system: str | list[wire.TextBlock] | None,
                messages: list[wire.MessageParam], omitted: list[str]) -> list[Message]:
    out: list[Message] = []
    if system and (text := _system_text(system, "system")):
        out.append(Message("system", text))
    tool_names: dict[str, str] = {}
    for i, param in enumerate(messages):
        if param.role == "system":      # rule 1: where it stands
            if text := _system_text(param.content, f"messages[{i}].content"):
                out.append(Message("system", text))
        elif isinstance(param.content, str):
            out.append(Message(param.role, param.content))
        elif param.role == "user":
            out.extend(_user_messages(param.content, i, tool_names, omitted))
        else:
            out.append(_assistant_message(param.content, i, tool_names))
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    return out


def to_tools(tools: list[wire.ToolParam] | None) -> list[Tool]:
    out = []
    for i, tool in enumerate(tools or []):
        if tool.type not in (None, "custom"):
            raise UnsupportedField(f"tools[{i}].type", f"'{tool.type}' is a server tool; only "
                                   "client tools (custom) are supported")
        schema = tool.input_schema or {"type": "object", "properties": {}}
        out.append(Tool(tool.name, tool.description, schema, strict=bool(tool.strict)))
    return out


def to_tool_choice(choice: wire.ToolChoice | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, wire.ToolChoiceAny):
        return "required"
    if isinstance(choice, wire.ToolChoiceTool):
        return choice.name
    return "none" if isinstance(choice, wire.ToolChoiceNone) else "auto"


def _thinking(req: wire.MessagesRequest | wire.CountTokensRequest) -> tuple[bool | None, int | None]:
    thinking = req.thinking
    if isinstance(thinking, wire.ThinkingBetweenTools):
        raise UnsupportedField("thinking.type", "'between_tools' is not supported; use "
                               "'enabled', 'adaptive' or 'disabled'")
    if getattr(thinking, "display", None) == "omitted":
        raise UnsupportedField("thinking.display", "'omitted' is not supported: a local "
                               "model's thinking is always returned")
    if isinstance(thinking, wire.ThinkingEnabled):
        if thinking.budget_tokens < 1:
            raise InvalidRequest("'thinking.budget_tokens' must be at least 1.",
                                 param="thinking.budget_tokens")
        return True, thinking.budget_tokens
    if isinstance(thinking, wire.ThinkingDisabled):
        return False, None
    effort = req.output_config.effort if req.output_config else None
    budget = EFFORT_BUDGET_TOKENS.get(effort or "")
    return (True if isinstance(thinking, wire.ThinkingAdaptive) else None), budget


def _response_format(req: wire.MessagesRequest | wire.CountTokensRequest) -> ResponseFormat | None:
    config = req.output_config
    if config is None:
        return None
    if config.format is None:
        return None
    return ResponseFormat("json_schema", schema=config.format.schema,
                          param="output_config.format")


def to_gen_request(req: wire.MessagesRequest | wire.CountTokensRequest) -> GenRequest:
    thinking, budget = _thinking(req)
    omitted: list[str] = []
    gen = GenRequest(model=req.model, messages=to_messages(req.system, req.messages, omitted),
                     omitted_images=omitted,
                     tools=to_tools(req.tools), tool_choice=to_tool_choice(req.tool_choice),
                     parallel_tool_calls=not getattr(req.tool_choice, "disable_parallel_tool_use",
                                                     False),
                     thinking=thinking, thinking_budget_tokens=budget,
                     response_format=_response_format(req))
    if gen.messages and gen.messages[-1].role == "assistant":  # rule 6: prefill
        gen.continue_final_message, gen.add_generation_prompt = True, False
    if isinstance(req, wire.MessagesRequest):
        _apply_generation_fields(gen, req)
    return gen


def _apply_generation_fields(gen: GenRequest, req: wire.MessagesRequest) -> None:
    if req.max_tokens < 1:
        raise InvalidRequest("'max_tokens' must be at least 1.", param="max_tokens")
    gen.max_tokens = req.max_tokens
    gen.speculative = req.speculative
    gen.stop = list(req.stop_sequences or [])
    gen.param_names["stop"] = "stop_sequences"   # core/checks.py rule 4 names it so
    gen.stream = req.stream
    sampling = SamplingParams()
    if req.temperature is not None:
        if not 0.0 <= req.temperature <= 1.0:
            raise InvalidRequest("'temperature' must be between 0 and 1.", param="temperature")
        sampling.temperature = req.temperature
    if req.top_p is not None:
        if not 0.0 < req.top_p <= 1.0:
            raise InvalidRequest("'top_p' must be in (0, 1].", param="top_p")
        sampling.top_p = req.top_p
    if req.top_k is not None:
        if req.top_k < 0:
            raise InvalidRequest("'top_k' must be non-negative.", param="top_k")
        sampling.top_k = req.top_k
    gen.sampling = sampling
    gen.sampling_sent = frozenset(name for name in ("temperature", "top_p", "top_k")
                                  if getattr(req, name) is not None)
    if req.metadata is not None and req.metadata.user_id is not None:
        gen.user = req.metadata.user_id


# -- response ------------------------------------------------------------------
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
    """Events of one choice -> Anthropic stream frames, and the final message (rule 7)."""

    id: str
    model: str
    prompt_tokens: int = 0
    blocks: list[dict[str, Any]] = field(default_factory=list)
    _open: str | None = None              # "text" | "thinking" | "tool_use"
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
            return self._delta("thinking", "thinking_delta", "thinking", event.text)
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

    def message(self) -> dict[str, Any]:
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
            signature = thinking_signature(self.blocks[index]["thinking"])
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
