"""POST /v1/chat/completions: wire struct -> GenRequest -> events -> OpenAI JSON / chunks.

Rules:
1. Everything that can fail (decoding, refusals, template, context ceiling,
   grammar) fails before the first SSE byte, as a real status code.
2. A choice's role chunk (`{"role": "assistant", "content": null}`) goes out
   when its first real delta is ready, right before it -- as llama-server sends
   it -- not ahead of prompt processing: clients time prompt processing by the
   first chunk. A choice that ends without a delta gets its role chunk right
   before its finish chunk. Then content / reasoning / tool-call deltas (no
   `role`), a finish chunk per choice; with
   `stream_options.include_usage` one more chunk with empty `choices` and
   `usage`; then `data: [DONE]`. An engine failure mid-stream is one
   `data: {"error": ...}` frame, after which the stream ends (no [DONE]).
3. `usage.prompt_tokens` counts the prompt once (n > 1 prefills once);
   completion tokens are summed over choices; `prompt_tokens_details` carries
   `cached_tokens` and, when measured, the `prefix_divergence` extension and
   (with the SSD tier on) `disk_cached_tokens`, the cached tokens read back
   from disk;
   when the request speculated (engine/speculative/), the `draft_tokens` /
   `draft_accepted` extensions count drafted and accepted tokens.
4. Reasoning goes out as `reasoning_content` (the vLLM / DeepSeek field).
5. finish_reason "abort" (client gone, shutdown) is reported as "stop".
6. A one-choice answer carries llama-server's `timings` extension (prompt and
   decode counts, times, rates; adapters/llamacpp/frames.py rule 3): in the
   body, and in a stream on the finish chunk and the usage chunk -- where
   llama-server's web UI and benchmark clients read it. OpenAI clients ignore it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from ...core.events import (
    Done,
    ErrorEvent,
    Event,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from ...core.images import ImageRef, attach_images, from_url, image_part
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, Tool, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from ...http.errors import error_body, llama_server_openai_error, openai_error
from ..endpoint import Answer, Protocol, generate, generating, translated
from ..llamacpp.frames import timings
from . import wire

if TYPE_CHECKING:
    from ...serving.handles import Run

_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")
_ENCODE = msgspec.json.Encoder()


def dumps(obj: Any) -> str:
    return _ENCODE.encode(obj).decode()


# --- request translation ---------------------------------------------------------

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


# --- shared response pieces ------------------------------------------------------

def finish_reason(done: Done) -> str:
    return "stop" if done.finish_reason in ("abort", "error") else done.finish_reason


@dataclass(slots=True)
class UsageSum:
    """Rule 3: prompt once, completion summed over choices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    disk_cached_tokens: int | None = None  # extension: of cached_tokens, from the SSD tier
    prefix_divergence: int | None = None
    reasoning_tokens: int | None = None
    draft_tokens: int | None = None     # extension: speculative tokens drafted / accepted
    draft_accepted: int | None = None

    def add_done(self, done: Done) -> None:
        self.add(done.usage)

    def add(self, usage: Usage) -> None:
        self.prompt_tokens = usage.prompt_tokens
        self.cached_tokens = usage.cached_tokens
        self.disk_cached_tokens = usage.disk_cached_tokens
        self.completion_tokens += usage.completion_tokens
        if usage.prefix_divergence is not None:
            self.prefix_divergence = usage.prefix_divergence
        if usage.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + usage.reasoning_tokens
        self.add_drafts(usage.draft_tokens, usage.draft_accepted)

    def add_drafts(self, drafted: int | None, accepted: int | None) -> None:
        if drafted is not None:
            self.draft_tokens = (self.draft_tokens or 0) + drafted
            self.draft_accepted = (self.draft_accepted or 0) + (accepted or 0)

    def as_dict(self) -> dict[str, Any]:
        details: dict[str, Any] = {"cached_tokens": self.cached_tokens}
        if self.disk_cached_tokens is not None:
            details["disk_cached_tokens"] = self.disk_cached_tokens
        if self.prefix_divergence is not None:
            details["prefix_divergence"] = self.prefix_divergence
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens,
                               "total_tokens": self.prompt_tokens + self.completion_tokens,
                               "prompt_tokens_details": details}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        if self.draft_tokens is not None:
            out["draft_tokens"] = self.draft_tokens
            out["draft_accepted"] = self.draft_accepted
        return out


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                             for t in lp.top]}


# --- non-streaming ---------------------------------------------------------------

@dataclass(slots=True)
class ChoiceAcc:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    done: Done | None = None


def accumulate(acc: dict[int, ChoiceAcc], event: Event) -> None:
    c = acc.setdefault(event.index, ChoiceAcc())
    if isinstance(event, TextDelta):
        c.text.append(event.text)
        c.logprobs.extend(event.logprobs)
    elif isinstance(event, ReasoningDelta):
        c.reasoning.append(event.text)
    elif isinstance(event, ToolCallStart):
        c.calls[event.call_index] = {"id": event.id, "type": "function",
                                     "function": {"name": event.name, "arguments": ""}}
    elif isinstance(event, ToolCallEnd):
        c.calls[event.call_index]["function"]["arguments"] = event.arguments
    elif isinstance(event, Done):
        c.done = event


async def collect(run: Run) -> dict[int, ChoiceAcc]:
    acc: dict[int, ChoiceAcc] = {}
    async for event in run.events():
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        accumulate(acc, event)
    return acc


def chat_choice(index: int, c: ChoiceAcc, want_logprobs: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(c.text)}
    if c.reasoning:
        message["reasoning_content"] = "".join(c.reasoning)
    if c.calls:
        message["tool_calls"] = [c.calls[k] for k in sorted(c.calls)]
        message["content"] = message["content"] or None
    assert c.done is not None
    return {"index": index, "message": message, "finish_reason": finish_reason(c.done),
            "logprobs": {"content": [logprob_entry(lp) for lp in c.logprobs]}
            if want_logprobs else None}


def chat_body(run: Run, acc: dict[int, ChoiceAcc], want_logprobs: bool) -> dict[str, Any]:
    usage = UsageSum()
    for c in acc.values():
        if c.done is not None:
            usage.add_done(c.done)
    body = {"id": f"chatcmpl-{run.id}", "object": "chat.completion", "created": run.created,
            "model": run.model, "system_fingerprint": f"frink-g{run.generation}",
            "choices": [chat_choice(i, acc[i], want_logprobs) for i in sorted(acc)],
            "usage": usage.as_dict()}
    only = acc.get(0) if len(acc) == 1 else None
    if only is not None and only.done is not None:   # rule 6
        body["timings"] = timings(only.done)
    return body


# --- streaming -------------------------------------------------------------------

def _delta(event: Event) -> dict[str, Any] | None:
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        return {"tool_calls": [{"index": event.call_index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ToolCallDelta):
        return {"tool_calls": [{"index": event.call_index,
                                "function": {"arguments": event.arguments}}]}
    return None


async def chat_frames(run: Run, include_usage: bool, want_logprobs: bool, n_choices: int = 1
                      ) -> AsyncIterator[str]:
    head = {"id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk", "created": run.created,
            "model": run.model, "system_fingerprint": f"frink-g{run.generation}"}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None,
              logprobs: Any = None, **extra: Any) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return f"data: {dumps({**head, 'choices': [choice], **extra})}\n\n"

    started: set[int] = set()   # rule 2: choices whose role went out
    usage = UsageSum()
    ends: list[Done] = []
    async for event in run.events():
        if isinstance(event, ErrorEvent):
            yield f"data: {dumps(error_body(event.to_error()))}\n\n"
            return
        delta = None if isinstance(event, Done) else _delta(event)
        if (delta is not None or isinstance(event, Done)) and event.index not in started:
            started.add(event.index)
            yield chunk(event.index, {"role": "assistant", "content": None})
        if isinstance(event, Done):
            usage.add_done(event)
            ends.append(event)
            extra = {"timings": timings(event)} if n_choices == 1 else {}   # rule 6
            yield chunk(event.index, {}, finish_reason(event), **extra)
            continue
        if delta is None:
            continue
        lps = None
        if want_logprobs and isinstance(event, TextDelta):
            lps = {"content": [logprob_entry(lp) for lp in event.logprobs]}
        yield chunk(event.index, delta, logprobs=lps)
    if include_usage:
        extra = {"timings": timings(ends[0])} if n_choices == 1 and ends else {}
        yield f"data: {dumps({**head, 'choices': [], 'usage': usage.as_dict(), **extra})}\n\n"
    yield "data: [DONE]\n\n"


# --- the endpoint (adapters/endpoint.py runs the skeleton) ----------------------

OPENAI = Protocol("openai", openai_error)
LLAMA_SERVER_OPENAI = Protocol("openai", llama_server_openai_error)  # its un-prefixed alias


async def start_chat(request: Request, body: wire.ChatCompletionRequest) -> Answer:
    (run,) = await generate(request, [await translated(request, to_gen_request, body)])
    want_logprobs = bool(body.logprobs)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def body_of() -> dict[str, Any]:
        return chat_body(run, await collect(run), want_logprobs)

    return Answer([run], body.stream,
                  lambda: chat_frames(run, include_usage, want_logprobs, body.n or 1), body_of)


chat_completions = generating(OPENAI, wire.ChatCompletionRequest, start_chat)
llama_server_chat_completions = generating(LLAMA_SERVER_OPENAI, wire.ChatCompletionRequest,
                                           start_chat)

routes: list[BaseRoute] = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/chat/completions", llama_server_chat_completions, methods=["POST"]),  # llama-server's
]
