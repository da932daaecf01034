"""Ollama /api/chat and /api/generate -> GenRequest. Pure functions, no I/O.

Field treatment (chat = /api/chat, gen = /api/generate; "no-op" = accepted,
documented, cannot change the answer):

| field                     | treatment                                                      |
|---------------------------|----------------------------------------------------------------|
| model                     | registry name or alias; a trailing `:latest` tag is dropped    |
| messages (chat)           | system/user/assistant/tool; `thinking` -> earlier reasoning;   |
|                           | `tool_calls` (arguments objects) -> calls; `tool_name` names a |
|                           | tool result; `images` -> placeholder texts (core/images.py)    |
| prompt, system (gen)      | rendered with the chat template as [system, user]              |
| raw (gen)                 | true: the prompt is continued as is, no template               |
| suffix (gen)              | fill-in-the-middle with the model's FIM tokens; 400 without    |
| template, context (gen)   | refused by name (no Go templates; no token-context replay)     |
| images                    | placeholder texts (text-only models; core/images.py); refused  |
|                           | by name with a raw or FIM prompt, or with `refuse_images`      |
| stream                    | default true: NDJSON, final frame `done: true`                 |
| format                    | "json" -> any JSON object; a schema -> that schema (llguidance)|
| tools                     | offered to the template; calls come back as `tool_calls`       |
| think                     | true/effort -> thinking on, false -> off; reasoning is always  |
|                           | returned apart, as `thinking`                                  |
| keep_alive                | seconds or a Go duration ("5m", "1h30m"): how long the model   |
|                           | stays resident once idle; 0 = unload when idle (with nothing to|
|                           | generate: unload now), negative = pinned (serving/residency);  |
|                           | past 100 years (or infinite) it is 100 years; NaN refused      |
| logprobs                  | false/absent only; true refused by name                        |
| options.*                 | see OPTION_TREATMENT                                           |

The answer's frames and their rules are frames.py's.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ...core.checks import MAX_STOP_SEQUENCES
from ...core.images import ImageRef, attach_images, image_part
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, Tool, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from . import wire

# Ollama option -> (treatment, SamplingParams field or note). "sampling": honoured;
# "noop": cannot change the answer (placement, threads, memory); "neutral": refused
# unless at the value that disables it.
OPTION_TREATMENT: dict[str, tuple[str, Any]] = {
    "temperature": ("sampling", "temperature"), "top_k": ("sampling", "top_k"),
    "top_p": ("sampling", "top_p"), "min_p": ("sampling", "min_p"),
    "repeat_penalty": ("sampling", "repetition_penalty"),
    "repeat_last_n": ("sampling", "penalty_context_size"),
    "presence_penalty": ("sampling", "presence_penalty"),
    "frequency_penalty": ("sampling", "frequency_penalty"),
    "seed": ("seed", None), "num_predict": ("num_predict", None), "stop": ("stop", None),
    "num_ctx": ("num_ctx", None),
    **{name: ("noop", None) for name in (
        "num_keep", "num_batch", "num_gpu", "main_gpu", "low_vram", "numa", "num_thread",
        "use_mmap", "use_mlock", "vocab_only", "logits_all", "embedding_only", "f16_kv",
        "penalize_newline")},  # penalize_newline: ignored by Ollama's own current engine
    "tfs_z": ("neutral", 1.0), "typical_p": ("neutral", 1.0), "mirostat": ("neutral", 0),
    "mirostat_tau": ("neutral", None), "mirostat_eta": ("neutral", None),
}
PARAM_NAMES = {"temperature": "options.temperature", "top_k": "options.top_k",
               "top_p": "options.top_p", "min_p": "options.min_p",
               "repetition_penalty": "options.repeat_penalty",
               "penalty_context_size": "options.repeat_last_n",
               "presence_penalty": "options.presence_penalty",
               "frequency_penalty": "options.frequency_penalty",
               "max_tokens": "options.num_predict", "stop": "options.stop"}
WHOLE_CONTEXT = 1 << 31


@dataclass(slots=True)
class Knobs:
    """What `options` asks for, translated."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    sent: set[str] = field(default_factory=set)
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    num_ctx: int | None = None


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequest(f"'options.{name}' must be a number.", param=f"options.{name}")
    return value


def _apply(knobs: Knobs, name: str, value: Any) -> None:
    kind, target = OPTION_TREATMENT[name]
    param = f"options.{name}"
    if kind == "sampling":
        number = _number(name, value)
        if name == "repeat_last_n" and number == -1:
            number = WHOLE_CONTEXT   # Ollama: -1 = the whole context
        if name == "top_k" and number <= 0:
            number = 0               # top_k <= 0 disables it
        setattr(knobs.sampling, target, int(number) if name in ("top_k", "repeat_last_n")
                else float(number))
        knobs.sent.add(target)
    elif kind == "seed":
        knobs.sampling.seed = int(_number(name, value))
    elif kind == "num_predict":
        number = int(_number(name, value))
        knobs.max_tokens = None if number in (-1, -2) else number  # -1 forever, -2 fill context
    elif kind == "stop":
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:  # before the walk
            raise InvalidRequest(f"'options.stop' holds {len(value)} stop sequences; at most "
                                 f"{MAX_STOP_SEQUENCES} are accepted.", param=param)
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise InvalidRequest("'options.stop' must be a list of strings.", param=param)
        knobs.stop = list(value)
    elif kind == "num_ctx":
        knobs.num_ctx = int(_number(name, value))
        if knobs.num_ctx < 1:
            raise InvalidRequest("'options.num_ctx' must be at least 1.", param=param)
    elif kind == "neutral" and value is not None and value != target:
        raise UnsupportedField(param, "is not supported (that sampler is not implemented); "
                               f"leave it out{'' if target is None else f' or send {target}'}")


def options_of(options: dict[str, Any] | None) -> Knobs:
    """`options` -> Knobs; an unknown option is refused by name (it might change the answer)."""
    knobs = Knobs()
    for name, value in (options or {}).items():
        if name not in OPTION_TREATMENT:
            raise UnsupportedField(f"options.{name}", "is not a known Ollama option")
        if value is not None:
            _apply(knobs, name, value)
    return knobs


def _tool_call(call: wire.ToolCall, i: int, k: int) -> ToolCall:
    return ToolCall(call.id or f"call_{i}_{k}", call.function.name,
                    json.dumps(call.function.arguments, ensure_ascii=False))


def _images(text: str, data: list[str] | None, where: str, images: list[ImageRef]) -> str:
    """Ollama's base64 `images` after the text, each as its placeholder (core/images.py)."""
    for k, b64 in enumerate(data or []):
        text += ("\n" if text else "") + image_part(ImageRef(f"{where}[{k}]", data=b64), images)
    return text


def to_messages(messages: list[wire.ChatMessage], images: list[ImageRef]) -> list[Message]:
    out = []
    for i, m in enumerate(messages):
        content = _images(m.content or "", m.images, f"messages[{i}].images", images)
        if m.role not in ("system", "user", "assistant", "tool"):
            raise InvalidRequest(f"'messages[{i}].role' must be system, user, assistant or "
                                 f"tool, got {m.role!r}.", param=f"messages[{i}].role")
        calls = [_tool_call(c, i, k) for k, c in enumerate(m.tool_calls or [])]
        out.append(Message(m.role, content, tool_calls=calls,  # type: ignore[arg-type]
                           tool_call_id=m.tool_call_id, name=m.tool_name,
                           reasoning=m.thinking))
    return out


def to_tools(tools: list[wire.ToolSpec] | None) -> list[Tool]:
    out = []
    for i, t in enumerate(tools or []):
        if t.type != "function":
            raise UnsupportedField(f"tools[{i}].type", f"'{t.type}' tools are not supported")
        out.append(Tool(t.function.name, t.function.description or "",
                        t.function.parameters or {"type": "object", "properties": {}}))
    return out


def to_response_format(fmt: wire.Format) -> ResponseFormat | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat("json_object", param="format")
    if isinstance(fmt, dict):
        return ResponseFormat("json_schema", schema=fmt, param="format")
    raise InvalidRequest(f"'format' must be \"json\" or a JSON schema object, got {fmt!r}.",
                         param="format")


def to_thinking(think: wire.Think) -> bool | None:
    if think is None or isinstance(think, bool):
        return think
    if think in ("low", "medium", "high"):
        return True
    raise InvalidRequest(f"'think' must be true, false, \"low\", \"medium\" or \"high\", "
                         f"got {think!r}.", param="think")


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
                   "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|ms|s|m|h)")


def keep_alive_seconds(value: wire.KeepAlive) -> float | None:
    """`keep_alive` as Ollama reads it: a number of seconds or a Go duration string
    ("5m", "1h30m", "-1m"); any negative = pinned. None = not given. Past
    MAX_KEEP_ALIVE_S (an infinite one included) it is that long: a deadline
    years away still has to be a date /api/ps can write. NaN is refused."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _bounded_keep_alive(float(value), value)
    text = str(value).strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    try:
        return _bounded_keep_alive(sign * float(body), value)  # "300", "-1": seconds
    except ValueError:
        pass
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise _bad_keep_alive(value)
    return _bounded_keep_alive(sign * sum(float(n) * _DURATION_UNITS[u] for n, u in parts), value)


MAX_KEEP_ALIVE_S = 100 * 365 * 24 * 3600.0


def _bounded_keep_alive(seconds: float, sent: object) -> float:
    if math.isnan(seconds):
        raise _bad_keep_alive(sent)
    return max(-MAX_KEEP_ALIVE_S, min(seconds, MAX_KEEP_ALIVE_S))


def _bad_keep_alive(sent: object) -> InvalidRequest:
    return InvalidRequest(f"'keep_alive' must be seconds or a duration such as \"5m\", "
                          f"got {str(sent)[:64]!r}.", param="keep_alive")


def model_name(name: str) -> str:
    """Ollama's `name:latest` is the name itself; an empty name is the default model."""
    name = name.removesuffix(":latest")
    return name or "default"


def _common(body: wire.ChatRequest | wire.GenerateRequest, knobs: Knobs) -> dict[str, Any]:
    if body.logprobs:
        raise UnsupportedField("logprobs", "is not supported on the Ollama API; use "
                               "/v1/chat/completions with logprobs")
    return dict(model=model_name(body.model), max_tokens=knobs.max_tokens, stop=knobs.stop,
                sampling=knobs.sampling, sampling_sent=frozenset(knobs.sent),
                stream=body.stream, thinking=to_thinking(body.think),
                response_format=to_response_format(body.format), param_names=dict(PARAM_NAMES))


def chat_request(body: wire.ChatRequest) -> GenRequest:
    knobs = options_of(body.options)
    if not body.messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    images: list[ImageRef] = []
    messages = attach_images(to_messages(body.messages, images), images)
    return GenRequest(messages=messages, tools=to_tools(body.tools), images=images,
                      **_common(body, knobs))


def generate_request(body: wire.GenerateRequest, prompt: str | None = None) -> GenRequest:
    """`prompt`: the fill-in-the-middle prompt the route built from `suffix`, if any."""
    knobs = options_of(body.options)
    for name in ("template", "context"):
        if getattr(body, name):
            raise UnsupportedField(name, {"template": "cannot be applied: Ollama's Go templates "
                                          "are not supported (the model's chat template is used)",
                                          "context": "cannot be replayed; send the conversation "
                                          "to /api/chat instead"}[name])
    if prompt is not None or body.raw:
        if body.images:
            raise UnsupportedField("images", "cannot be read with a raw or fill-in-the-middle "
                                   "prompt on a text-only model")
        return GenRequest(prompt=prompt if prompt is not None else body.prompt or "",
                          **_common(body, knobs))
    images: list[ImageRef] = []
    text = _images(body.prompt or "", body.images, "images", images)
    messages = ([Message("system", body.system)] if body.system else []) + \
        [Message("user", text, images=list(images))]
    return GenRequest(messages=messages, images=images, **_common(body, knobs))
