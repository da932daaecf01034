"""OpenAI chat and completions requests -> GenRequest. Pure functions, no I/O.

The chat route's rules are chat.py's, the completions route's completions.py's;
what is translated here is named by field, and refused by name where it cannot
be honoured (adapters/fields.py holds the field table).
"""

from __future__ import annotations

from typing import Any

from ...core.checks import check_batch
from ...core.images import ImageRef, attach_images, from_url, image_part
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, Tool, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from . import wire

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")


# --- chat ------------------------------------------------------------------------

def sampling_of(body: wire.SamplingWire, *, logprobs: bool, top_logprobs: int
                ) -> tuple[SamplingParams, frozenset[str]]:
    """SamplingParams from the fields the client sent, and their names."""
    sent = {f: getattr(body, f) for f in _SAMPLING_FIELDS if getattr(body, f) is not None}
    if sent.get("top_k") == -1:
        sent["top_k"] = 0
    params = SamplingParams(**sent, logit_bias=wire.logit_bias_ids(body.logit_bias),
                            logprobs=logprobs, top_logprobs=top_logprobs)
    return params, frozenset(sent)


def _image_url(part: wire.ContentPart, where: str) -> ImageRef:
    url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
    return from_url(where, url)


def _content(content: str | list[wire.ContentPart] | None, i: int,
             images: list[ImageRef]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if part.type == "image_url":                       # core/images.py rule 1
            texts.append(image_part(_image_url(part, f"messages[{i}].content[{j}]"), images))
            continue
        if part.type != "text" or part.text is None:
            raise UnsupportedField(f"messages[{i}].content[{j}].type",
                                   f"'{part.type}' content is not supported (text only)")
        texts.append(part.text)
    return "".join(texts)


def _message(m: wire.ChatMessage, i: int, images: list[ImageRef]) -> Message:
    if m.role == "function" or m.function_call is not None:
        raise UnsupportedField(f"messages[{i}].role" if m.role == "function"
                               else f"messages[{i}].function_call",
                               "is deprecated and not supported; use tool messages")
    if m.audio is not None:
        raise UnsupportedField(f"messages[{i}].audio", "is not supported (text only)")
    calls = [ToolCall(c.id or f"call_{i}_{k}", c.function.name, c.function.arguments or "{}")
             for k, c in enumerate(m.tool_calls or [])]
    role = "system" if m.role == "developer" else m.role
    return Message(role, _content(m.content, i, images), tool_calls=calls,
                   tool_call_id=m.tool_call_id, name=m.name,
                   reasoning=m.reasoning_content or m.reasoning)


def _tools(body: wire.ChatCompletionRequest) -> tuple[list[Tool], str]:
    tools = []
    for i, t in enumerate(body.tools or []):
        if t.type != "function":
            raise UnsupportedField(f"tools[{i}].type", f"'{t.type}' tools are not supported")
        params = t.function.parameters or {"type": "object", "properties": {}}
        tools.append(Tool(t.function.name, t.function.description, params,
                          strict=bool(t.function.strict)))
    choice = body.tool_choice
    if choice is None:
        return tools, "auto"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InvalidRequest(f"'tool_choice' must be auto, none, required or a function, "
                                 f"got {choice!r}.", param="tool_choice")
        return tools, choice
    if choice.function.name not in {t.name for t in tools}:
        raise InvalidRequest(f"'tool_choice' names '{choice.function.name}', which is not in "
                             "'tools'.", param="tool_choice")
    return tools, choice.function.name


def _response_format(body: wire.ChatCompletionRequest) -> ResponseFormat | None:
    rf = body.response_format
    extra = wire.llamacpp_format(body, rf)
    if extra is not None:
        return extra
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return ResponseFormat("json_object")
    js = rf.json_schema
    if js is None or js.schema is None:
        raise InvalidRequest("'response_format.json_schema.schema' is required for json_schema.",
                             param="response_format.json_schema")
    return ResponseFormat("json_schema", schema=js.schema, strict=bool(js.strict), name=js.name)


def _template_kwargs(body: wire.ChatCompletionRequest) -> dict[str, Any]:
    """chat_template_kwargs but enable_thinking: checked against the model's template
    when the prompt is rendered (core/template_kwargs.py rule 1)."""
    return {k: v for k, v in (body.chat_template_kwargs or {}).items() if k != "enable_thinking"}


def _thinking(body: wire.ChatCompletionRequest) -> bool | None:
    thinking = (body.chat_template_kwargs or {}).get("enable_thinking")
    if thinking is not None and not isinstance(thinking, bool):
        raise InvalidRequest("'chat_template_kwargs.enable_thinking' must be a boolean.",
                             param="chat_template_kwargs.enable_thinking")
    if thinking is None and body.reasoning_effort is not None:
        thinking = body.reasoning_effort not in ("none", "minimal")
    return thinking


def to_gen_request(body: wire.ChatCompletionRequest) -> GenRequest:
    wire.refuse_unsupported(body)
    if body.logprobs is not None and not isinstance(body.logprobs, bool):
        raise InvalidRequest("'logprobs' must be a boolean.", param="logprobs")
    if body.top_logprobs and not body.logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    if body.add_generation_prompt is True and body.continue_final_message:
        raise InvalidRequest("'add_generation_prompt' and 'continue_final_message' cannot both "
                             "be true.", param="continue_final_message")
    if not body.messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    sampling, sent = sampling_of(body, logprobs=bool(body.logprobs),
                                 top_logprobs=body.top_logprobs or 0)
    tools, tool_choice = _tools(body)
    images: list[ImageRef] = []
    messages = [_message(m, i, images) for i, m in enumerate(body.messages)]
    return GenRequest(
        model=body.model or "default", images=images, messages=attach_images(messages, images),
        tools=tools, tool_choice=tool_choice, parallel_tool_calls=body.parallel_tool_calls
        is not False, cache_prompt=body.cache_prompt,
        max_tokens=wire.max_tokens(("max_completion_tokens", body.max_completion_tokens),
                                   ("max_tokens", body.max_tokens), ("n_predict", body.n_predict)),
        stop=wire.stop_list(body.stop), sampling=sampling, sampling_sent=sent, n=body.n,
        stream=body.stream, cache_salt=body.cache_salt, speculative=body.speculative,
        thinking=_thinking(body), reasoning_effort=body.reasoning_effort,
        template_kwargs=_template_kwargs(body),
        response_format=_response_format(body),
        add_generation_prompt=body.add_generation_prompt is not False,
        continue_final_message=body.continue_final_message, ignore_eos=body.ignore_eos,
        max_predict_ms=wire.time_budget_ms(body.t_max_predict_ms),
        min_indent=wire.indent_limit(body.n_indent), user=body.user)


# --- completions -----------------------------------------------------------------

def _prompts(prompt: Any, n: int, max_n: int) -> list[Any]:
    """completions.py rule 1: one prompt or a batch, each a string or a token-id list; a
    batch is at most `max_n` choices (core/checks.py rule 4), checked before it is walked."""
    if prompt is None or prompt == [] or prompt == "":
        raise InvalidRequest("'prompt' is required and may not be empty.", param="prompt")
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    check_batch(len(prompt), n, max_n=max_n)
    if not (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt)):
        raise InvalidRequest("'prompt' must be a string, a list of token ids, a list of strings "
                             "or a list of token-id lists.", param="prompt")
    for i, p in enumerate(prompt):
        if (isinstance(p, str) and not p) or (isinstance(p, list) and not p):
            raise InvalidRequest(f"'prompt[{i}]' is empty.", param="prompt")
    return list(prompt)


def _logprobs_n(value: Any) -> int | None:
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 5:
        raise InvalidRequest("'logprobs' must be an integer from 0 to 5.", param="logprobs")
    return value


def to_gen_requests(body: wire.CompletionRequest, *, max_n: int
                    ) -> tuple[list[GenRequest], int | None]:
    wire.refuse_unsupported(body)
    top = _logprobs_n(body.logprobs)
    if body.echo and top is not None:
        raise UnsupportedField("echo", "cannot be combined with 'logprobs' "
                               "(prompt logprobs are not computed)")
    sampling, sent = sampling_of(body, logprobs=top is not None, top_logprobs=top or 0)
    limit = wire.max_tokens(("max_tokens", body.max_tokens), ("n_predict", body.n_predict))
    unset = body.max_tokens is None and body.n_predict is None
    reqs = [GenRequest(model=body.model or "default", prompt=p,
                       max_tokens=16 if unset else limit, cache_prompt=body.cache_prompt,
                       response_format=wire.llamacpp_format(body),
                       stop=wire.stop_list(body.stop), sampling=sampling, sampling_sent=sent,
                       n=body.n, stream=body.stream, echo=body.echo, cache_salt=body.cache_salt,
                       speculative=body.speculative,
                       ignore_eos=body.ignore_eos, user=body.user,
                       max_predict_ms=wire.time_budget_ms(body.t_max_predict_ms),
                       min_indent=wire.indent_limit(body.n_indent),
                       param_names={"top_logprobs": "logprobs"})
            for p in _prompts(body.prompt, body.n, max_n)]
    return reqs, top
