"""Anthropic Messages -> the neutral GenRequest. Pure functions, no I/O.

(The response side, events -> frames, is frames.py.)

Rules:
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
   (the whole thinking is returned); "omitted" (Claude Code 2.1's first try) is
   honoured: the thinking text is left out of the response (frames.py rule 2), so
   a replayed thinking block is empty and the turn goes back without its reasoning.
   `output_config.effort` bounds the thinking: `low` -> 1,024 tokens, `medium` ->
   4,096, `high` / `xhigh` / `max` -> unbounded (the model decides), unless
   `thinking.budget_tokens` is given, which wins; with thinking disabled it is a
   no-op (there is no thinking to bound). `output_config.format` (JSON schema)
   becomes the structured-output constraint.
6. A conversation ending in an assistant turn is a prefill: the reply continues
   that text (the template renders it open, without its end-of-turn marker).
7. `tools[].defer_loading: true` (tool search, Claude Code 2.1) keeps a tool out
   of the prompt, as Anthropic keeps it out of the model's context, until a
   `tool_reference` block naming it comes back in a tool result; then it is
   offered, and the reference reads as a line saying the tool was loaded.
8. `context_management.edits` (Anthropic's context editing): `clear_thinking_*`
   keeps the reasoning of the last `keep` assistant turns that have any
   (`"all"`: every turn; default 1) and drops the older turns' reasoning from the
   prompt; `clear_tool_uses_*` (old tool results replaced once the prompt passes a
   token count) is refused by name, as is any other edit.
"""

from __future__ import annotations

import json
from typing import AbstractSet, Any

from ...core.images import ImageRef, image_part
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, Tool, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from . import wire

# -- request -------------------------------------------------------------------
BILLING_HEADER = "x-anthropic-billing-header:"      # rule 1
EFFORT_BUDGET_TOKENS = {"low": 1024, "medium": 4096}    # rule 5; others: unbounded


def _system_text(blocks: str | list[Any], where: str) -> str:
    """A system prompt's text without Claude Code's billing-header block (rule 1)."""
    if isinstance(blocks, str):
        return "" if blocks.startswith(BILLING_HEADER) else blocks
    return _text_of([b for b in blocks if not (isinstance(b, wire.TextBlock)
                                               and b.text.startswith(BILLING_HEADER))], where)


def _image(block: wire.ImageBlock, where: str) -> ImageRef:
    """An image block's source (base64 or url) as an ImageRef (core/images.py rule 1)."""
    source = block.source if isinstance(block.source, dict) else {}
    data, url = source.get("data"), source.get("url")
    media = source.get("media_type")
    return ImageRef(where, data=data if isinstance(data, str) else None,
                    url=url if isinstance(url, str) else None,
                    media_type=media if isinstance(media, str) else None)


def _text_of(blocks: str | list[Any], where: str, images: list[ImageRef] | None = None) -> str:
    """Blocks' text; with `images`, an image block becomes the placeholder text
    (core/images.py rule 1), else it is refused naming it."""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for j, block in enumerate(blocks):
        if images is not None and isinstance(block, wire.ImageBlock):
            parts.append(image_part(_image(block, f"{where}[{j}]"), images))
            continue
        if isinstance(block, wire.ToolReferenceBlock):      # rule 7
            parts.append(f"Tool loaded: {block.tool_name}")
            continue
        if not isinstance(block, wire.TextBlock):
            raise UnsupportedField(f"{where}[{j}]", f"is a '{_tag(block)}' block; this server "
                                   "serves text-only models")
        parts.append(block.text)
    return "\n".join(parts)


def _tag(block: Any) -> str:
    return str(type(block).__struct_config__.tag)


def _user_messages(blocks: list[wire.ContentBlock], i: int,
                   tool_names: dict[str, str], images: list[ImageRef]) -> list[Message]:
    """Tool results first, then the turn's text; each message holds its own images."""
    tools: list[Message] = []
    texts: list[str] = []
    own: list[ImageRef] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if isinstance(block, wire.ToolResultBlock):
            shown: list[ImageRef] = []
            content = _text_of(block.content, f"{where}.content", shown)
            tools.append(Message("tool", ("Error: " + content) if block.is_error else content,
                                 tool_call_id=block.tool_use_id,
                                 name=tool_names.get(block.tool_use_id), images=shown))
            images.extend(shown)
        elif isinstance(block, wire.TextBlock):
            texts.append(block.text)
        elif isinstance(block, wire.ImageBlock):
            texts.append(image_part(_image(block, where), own))
        else:
            raise UnsupportedField(where, f"is a '{_tag(block)}' block, which a user turn "
                                   "cannot carry here")
    if texts:
        tools.append(Message("user", "\n".join(texts), images=own))
        images.extend(own)
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
                messages: list[wire.MessageParam], images: list[ImageRef]) -> list[Message]:
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
            out.extend(_user_messages(param.content, i, tool_names, images))
        else:
            out.append(_assistant_message(param.content, i, tool_names))
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    return out


def referenced_tools(messages: list[wire.MessageParam]) -> set[str]:
    """Rule 7: the tools `tool_reference` blocks in tool results have loaded."""
    names: set[str] = set()
    for param in messages:
        for block in param.content if isinstance(param.content, list) else ():
            if isinstance(block, wire.ToolResultBlock) and isinstance(block.content, list):
                names.update(ref.tool_name for ref in block.content
                             if isinstance(ref, wire.ToolReferenceBlock))
    return names


def to_tools(tools: list[wire.ToolParam] | None,
             loaded: AbstractSet[str] = frozenset()) -> list[Tool]:
    out = []
    for i, tool in enumerate(tools or []):
        if tool.type not in (None, "custom"):
            raise UnsupportedField(f"tools[{i}].type", f"'{tool.type}' is a server tool; only "
                                   "client tools (custom) are supported")
        if tool.defer_loading and tool.name not in loaded:      # rule 7
            continue
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


def thinking_shown(req: wire.MessagesRequest) -> bool:
    """Rule 5: False when the client asked for the thinking text to be left out."""
    return getattr(req.thinking, "display", None) != "omitted"


def _edit_context(messages: list[Message], config: wire.ContextManagement | None) -> None:
    """Rule 8: apply `clear_thinking` edits to the translated messages; refuse the rest."""
    for i, edit in enumerate(config.edits if config else ()):
        if not edit.type.startswith("clear_thinking_"):
            raise UnsupportedField(f"context_management.edits[{i}].type",
                                   f"'{edit.type}' is not supported; only clear_thinking edits "
                                   "are (the prompt is kept whole otherwise)")
        if edit.keep == "all":
            continue
        keep = 1 if edit.keep is None else edit.keep.value
        if keep < 0:
            raise InvalidRequest("'keep.value' must be non-negative.",
                                 param=f"context_management.edits[{i}].keep.value")
        thinking_turns = [m for m in messages if m.role == "assistant" and m.reasoning]
        for message in thinking_turns[:max(0, len(thinking_turns) - keep)]:
            message.reasoning = None


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
    images: list[ImageRef] = []
    messages = to_messages(req.system, req.messages, images)
    _edit_context(messages, req.context_management)
    gen = GenRequest(model=req.model, messages=messages, images=images,
                     tools=to_tools(req.tools, referenced_tools(req.messages)),
                     tool_choice=to_tool_choice(req.tool_choice),
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
    if req.top_p is not None:   # its range is every protocol's (core/checks.py rule 3)
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
