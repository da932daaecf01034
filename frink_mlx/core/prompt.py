"""GenRequest -> prompt token ids: chat templates, tools, thinking, raw prompts.

This runs before any byte of the answer is sent, so every failure here is a
real 400 naming the field, even on streaming requests.

Rules:
1. Chat requests are rendered with the model's chat template (or the
   registry's override) to text, then encoded without special tokens -- the
   template writes BOS itself. This is exactly what `mlx_lm.generate` does, so
   greedy output matches it token for token.
2. Messages go to the template in the HF shape: `content` as a string,
   assistant `tool_calls` as `{"id", "type": "function", "function": {"name",
   "arguments": <dict when the JSON parses>}}`, tool results with
   `tool_call_id`/`name`, earlier reasoning as `reasoning_content`.
3. `thinking` None leaves the template's default; True/False is passed as
   `enable_thinking` (mlx-lm's wrapper renames it for templates that differ),
   or as `thinking` to a template that reads only that (template_kwargs.py
   rule 4). The client's `chat_template_kwargs` and reasoning effort reach
   the template where it reads them (template_kwargs.py rules 1-5).
4. Raw text prompts are encoded as the tokenizer does, adding BOS unless the
   text already starts with it (mlx_lm's rule); token-id prompts are checked
   against the vocabulary.
5. Template errors (Jinja exceptions, a missing template) -> InvalidRequest
   with `param="messages"`; bad token ids -> `param="prompt"`; a logit_bias id
   outside the vocabulary -> the protocol's `logit_bias` (core/checks.py rule 5).
6. Offered tools reach the model even when its template never reads `tools`
   (SmolLM2's own): the template source is checked for the name, and when it
   is absent a Hermes tools block (`<tools>` signatures + `<tool_call>`
   instructions, as Qwen2.5 writes it) is added to the system message, earlier
   assistant calls are written into their content as `<tool_call>` markup, and
   `RenderedPrompt.injected_tools` tells the parser to expect Hermes calls --
   unless the model's family has a tools block of its own
   (family_prompts.py rule 2), which is used instead, its calls left native.
7. With `image_parts`, a message that holds images (core/images.py rule 4)
   goes to the template as HF content parts: `{"type": "text"}` pieces and one
   `{"type": "image"}` where each of its placeholders stands, in order; the
   vision processor expands the template's image markers (serving/vision.py).
8. Given a `ceiling`, a text far longer than it could hold is refused without
   tokenizing all of it (8 MiB took a minute of CPU, and freeing the
   tokenizer's result held the GIL, so the event loop, for a quarter second
   per 700k tokens): a text of more than HEAD_CHARS_PER_TOKEN chars per token
   of the ceiling has its head of that many chars tokenized first, and more
   than twice the ceiling in the head is ContextLengthExceeded "at least" half
   the head's count -- a cut moves token boundaries only next to it, never by
   half. A text that fits (or nearly) is tokenized once, whole, as before.

The tokenizer is duck-typed (mlx-lm's TokenizerWrapper or an HF tokenizer):
`apply_chat_template`, `encode`, `bos_token`, `vocab_size`/`len()`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ContextLengthExceeded, InvalidRequest
from .family_prompts import FAMILY_TOOL_BLOCKS, arguments_as_text
from .images import IMAGE_PLACEHOLDER
from .request import GenRequest, Message, Tool
from .template_kwargs import client_kwargs, effort_kwargs, template_source, thinking_kwarg


@dataclass(slots=True, frozen=True)
class RenderedPrompt:
    ids: list[int]
    text: str | None          # the rendered text (None for token-id prompts)
    opens_thinking: bool = False
    injected_tools: bool = False   # rule 6: the Hermes tools block was added by us


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return raw


def content_parts(message: Message) -> list[dict[str, Any]]:
    """Rule 7: the message's text split at its first len(images) placeholders."""
    pieces = message.content.split(IMAGE_PLACEHOLDER, len(message.images))
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(pieces):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def message_dict(message: Message, *, arguments_text: bool = False,
                 image_parts: bool = False) -> dict[str, Any]:
    content: Any = content_parts(message) if image_parts and message.images \
        else message.content
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments if arguments_text
                          else _arguments(c.arguments)}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    return out


def tool_dict(tool: Tool) -> dict[str, Any]:
    return {"type": "function",
            "function": {"name": tool.name, "description": tool.description,
                         "parameters": tool.parameters}}


_TOOLS_VAR = re.compile(r"\btools\b")
HERMES_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
HERMES_TOOLS_TAIL = (
    "</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def template_reads_tools(tokenizer: Any, template: str | None) -> bool:
    """Rule 6: whether the chat template in use ever mentions `tools`."""
    source = template_source(tokenizer, template)
    return source is None or bool(_TOOLS_VAR.search(source))


def hermes_tools_block(tools: list[Tool]) -> str:
    lines = "".join("\n" + json.dumps(tool_dict(t), ensure_ascii=False) for t in tools)
    return f"{HERMES_TOOLS_HEAD}{lines}\n{HERMES_TOOLS_TAIL}"


def _inject_tools(messages: list[dict[str, Any]], tools: list[Tool],
                  tool_format: str | None = None) -> list[dict[str, Any]]:
    """Rule 6: the tools block in the system message; earlier calls as markup in content
    (a family block leaves them to the template: family_prompts.py rule 2)."""
    family_block = FAMILY_TOOL_BLOCKS.get(tool_format or "")
    out = []
    for m in messages:
        calls = None if family_block else m.pop("tool_calls", None)
        if calls:
            markup = "".join(
                "<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                              "arguments": c["function"]["arguments"]},
                                             ensure_ascii=False) + "\n</tool_call>"
                for c in calls)
            m = {**m, "content": [*m["content"], {"type": "text", "text": markup}]
                 if isinstance(m["content"], list)      # rule 7's parts
                 else (m["content"] + "\n" if m["content"] else "") + markup}
        out.append(m)
    block = family_block(tools) if family_block else hermes_tools_block(tools)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": block})
    return out


def _template_kwargs(request: GenRequest, template: str | None, source: str | None
                     ) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"add_generation_prompt": request.add_generation_prompt}
    if request.continue_final_message:
        kwargs["continue_final_message"] = True
        kwargs["add_generation_prompt"] = False
    if request.thinking is not None:
        kwargs[thinking_kwarg(source)] = request.thinking
    kwargs.update(effort_kwargs(request.reasoning_effort, source))
    kwargs.update(client_kwargs(request.template_kwargs, source))
    if request.tools and request.tool_choice != "none":
        kwargs["tools"] = [tool_dict(t) for t in request.tools]
    if template is not None:
        kwargs["chat_template"] = template
    return kwargs


def has_chat_template(tokenizer: Any) -> bool:
    flag = getattr(tokenizer, "has_chat_template", None)
    if isinstance(flag, bool):
        return flag
    return getattr(tokenizer, "chat_template", None) is not None


def render_chat_text(tokenizer: Any, request: GenRequest, template: str | None = None,
                     *, image_parts: bool = False, tool_format: str | None = None) -> str:
    """The chat template applied to `request.messages` (rules 1-3, 5-7)."""
    return _render_chat_text(tokenizer, request, template, tool_format, image_parts)[0]


def _render_chat_text(tokenizer: Any, request: GenRequest, template: str | None,
                      tool_format: str | None = None, image_parts: bool = False
                      ) -> tuple[str, bool]:
    """(text, whether rule 6 injected the Hermes tools block)."""
    if not request.messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    if template is None and not has_chat_template(tokenizer):
        raise InvalidRequest(
            "This model has no chat template; send a raw prompt to /v1/completions "
            "or set chat_template for it in models.toml.", param="messages")
    source = template_source(tokenizer, template)
    as_text = arguments_as_text(source)   # family_prompts.py rule 1
    messages = [message_dict(m, arguments_text=as_text, image_parts=image_parts)
                for m in request.messages]
    kwargs = _template_kwargs(request, template, source)
    inject = "tools" in kwargs and not template_reads_tools(tokenizer, template)
    if inject:
        messages = _inject_tools(messages, request.tools, tool_format)
        del kwargs["tools"]
        inject = tool_format not in FAMILY_TOOL_BLOCKS
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception as exc:  # Jinja raises many types; all are the request's problem
        raise InvalidRequest(f"The chat template could not render these messages: {exc}",
                             param="messages") from None
    if not isinstance(text, str):
        raise InvalidRequest("The chat template did not produce text.", param="messages")
    return text, inject


HEAD_CHARS_PER_TOKEN = 16  # rule 8: English runs about 4 chars a token, code 3


def _refuse_hopeless(tokenizer: Any, text: str, ceiling: int | None, param: str,
                     add_special_tokens: bool) -> None:
    """Rule 8: refuse a text far longer than the ceiling could hold, tokenizing only its
    head."""
    if ceiling is None or len(text) <= ceiling * HEAD_CHARS_PER_TOKEN:
        return
    head = tokenizer.encode(text[:ceiling * HEAD_CHARS_PER_TOKEN],
                            add_special_tokens=add_special_tokens)
    if len(head) > 2 * ceiling:
        raise ContextLengthExceeded(len(head) // 2, ceiling, param=param, at_least=True)


def render_chat(tokenizer: Any, request: GenRequest, *, template: str | None = None,
                think_start: str | None = None, tool_format: str | None = None,
                ceiling: int | None = None) -> RenderedPrompt:
    text, injected = _render_chat_text(tokenizer, request, template, tool_format)
    _refuse_hopeless(tokenizer, text, ceiling, "messages", False)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    opens = bool(think_start) and text.rstrip().endswith(think_start)  # type: ignore[arg-type]
    return RenderedPrompt(ids, text, opens_thinking=opens, injected_tools=injected)


def encode_text(tokenizer: Any, text: str, *, add_special_tokens: bool = True) -> list[int]:
    """Rule 4 for text: BOS is added unless asked not to or already present."""
    bos = getattr(tokenizer, "bos_token", None)
    add = add_special_tokens and not (bos and text.startswith(bos))
    return list(tokenizer.encode(text, add_special_tokens=add))


def _vocab_size(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return int(tokenizer.vocab_size)


def check_token_ids(tokenizer: Any, ids: list[Any], param: str = "prompt") -> list[int]:
    limit = _vocab_size(tokenizer)
    for i, tok in enumerate(ids):
        if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < limit:
            raise InvalidRequest(f"'{param}[{i}]' is not a token id of this model (0..{limit - 1}).",
                                 param=param)
    return list(ids)


def check_bias_ids(tokenizer: Any, request: GenRequest) -> None:
    """Rule 5: every logit_bias key is a token id of this model."""
    bias = request.sampling.logit_bias
    if not bias:
        return
    limit = _vocab_size(tokenizer)
    bad = next((t for t in bias if not 0 <= t < limit), None)
    if bad is not None:
        param = request.param_names.get("logit_bias", "logit_bias")
        raise InvalidRequest(f"'{param}' names token {bad}, which is not a token id of this "
                             f"model (0..{limit - 1}).", param=param)


def render_raw(tokenizer: Any, request: GenRequest, ceiling: int | None = None) -> RenderedPrompt:
    prompt = request.prompt
    if isinstance(prompt, str):
        _refuse_hopeless(tokenizer, prompt, ceiling, "prompt", False)
        return RenderedPrompt(encode_text(tokenizer, prompt,
                                          add_special_tokens=request.add_special_tokens), prompt)
    if isinstance(prompt, list) and prompt:
        return RenderedPrompt(check_token_ids(tokenizer, prompt), None)
    raise InvalidRequest("'prompt' must be a non-empty string or list of token ids.", param="prompt")


def render_prompt(tokenizer: Any, request: GenRequest, *, template: str | None = None,
                  think_start: str | None = None, tool_format: str | None = None,
                  ceiling: int | None = None) -> RenderedPrompt:
    """The ids to prefill for `request` (chat or raw); `ceiling`: rule 8."""
    check_bias_ids(tokenizer, request)
    if request.messages is not None:
        if request.prompt is not None:
            raise InvalidRequest("Send either 'messages' or 'prompt', not both.", param="prompt")
        return render_chat(tokenizer, request, template=template, think_start=think_start,
                           tool_format=tool_format, ceiling=ceiling)
    if request.prompt is None:
        raise InvalidRequest("The request has neither 'messages' nor 'prompt'.", param="messages")
    rendered = render_raw(tokenizer, request, ceiling)
    if not rendered.ids:
        raise InvalidRequest("'prompt' encodes to no tokens.", param="prompt")
    return rendered
