"""Ollama API: POST /api/chat, /api/generate, /api/embed, /api/embeddings, and
(models.py) /api/tags, /api/show, /api/ps, /api/version, /api/pull.

So every tool that speaks only Ollama's API (the `ollama` Python client, Open
WebUI, Continue's and Zed's Ollama providers, ...) works unmodified. The
generating routes run adapters/endpoint.py's skeleton with NDJSON framing;
translate.py holds the field table, frames.py the frames. Quirks kept on purpose:
1. `stream` defaults to true; streams are NDJSON, one JSON object per line,
   the last with `done: true` and the timing fields (no keepalive lines: a
   blank line would break the clients' JSON-per-line readers).
2. Errors are `{"error": "<message>"}` with the error's status -- also for
   refusals before routing (http/security.py picks the envelope by path).
3. A chat with no messages, or a generate with no prompt, loads the model and
   answers `done_reason: "load"` (how Ollama clients preload a model).
4. `options.num_ctx` cannot resize the daemon's context: a prompt longer than
   num_ctx is refused naming it (Ollama would cut the prompt); otherwise it
   changes nothing.
5. /api/generate `suffix` is fill-in-the-middle through the model's FIM tokens
   (the same lookup as llama.cpp's /infill); a model without them is a 400
   naming `suffix`.
6. /api/embed truncates over-long inputs by default, as Ollama does
   (`truncate: false` makes them a 400); /api/embeddings is the legacy
   one-prompt form (`{"embedding": [...]}`; an empty prompt gets `[]`).
   Embedding `options` are checked like the others and change nothing.
7. `keep_alive` (seconds or a Go duration) becomes the served model's
   keep-alive in the resident set (serving/residency.py): how long it stays loaded
   once idle, 0 = evicted as soon as it is idle, negative = pinned. With
   nothing to generate, `keep_alive: 0` unloads the model now (`done_reason:
   "unload"`), as Ollama's unload idiom does.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...core.events import choice_events
from ...core.request import GenRequest
from ...errors import InvalidRequest, UnsupportedField
from ...http.access import note_generation
from ...http.body import decode_body
from ...http.errors import endpoint, ollama_error
from ...http.frontend import frontend
from ..endpoint import (
    NDJSON_MEDIA_TYPE,
    Answer,
    Protocol,
    collected,
    generate,
    generating,
    json_response,
    ndjson_line,
    translated,
)
from ..llamacpp import FIM_STYLES, fim_style
from . import models, wire
from .frames import AnswerBuilder, Clock, now_rfc3339
from .translate import (
    chat_request,
    generate_request,
    keep_alive_seconds,
    model_name,
    options_of,
)

if TYPE_CHECKING:
    from ...serving.handles import Run

OLLAMA = Protocol("ollama", ollama_error, media_type=NDJSON_MEDIA_TYPE, keepalive_frame=None)


async def _frames(run: Run, builder: AnswerBuilder) -> AsyncIterator[str]:
    async for event in choice_events(run.events()):
        for frame in builder.feed(event):
            yield ndjson_line(frame)


def _keep_alive(request: Request, name: str, seconds: float | None) -> None:
    """Rule 7: the request's keep_alive becomes the resident model's (serving/residency.py)."""
    hub = frontend(request).hub
    gen = hub.residency.find(name) if seconds is not None else None
    if gen is not None:
        hub.keep_alive(gen, seconds)


async def _answer(request: Request, gen: GenRequest, num_ctx: int | None, clock: Clock,
                  chat: bool, keep_alive_s: float | None) -> Answer:
    (run,) = await generate(request, [gen])
    clock.loaded()
    _keep_alive(request, run.model, keep_alive_s)
    if num_ctx is not None and run.prompt_tokens > num_ctx:  # rule 4
        await run.abort()
        raise InvalidRequest(f"The prompt has {run.prompt_tokens} tokens, more than "
                             f"options.num_ctx ({num_ctx}).", param="options.num_ctx")
    builder = AnswerBuilder(run.model, chat, clock)
    return Answer([run], gen.stream, lambda: _frames(run, builder),
                  lambda: collected(run, builder))


async def _load_only(request: Request, name: str, stream: bool, chat: bool,
                     keep_alive_s: float | None) -> Answer:
    """Rule 3: lease (loading or swapping to) the model, generate nothing; with
    `keep_alive: 0`, unload it instead (rule 7)."""
    front = frontend(request)
    if keep_alive_s == 0:
        gone = await front.hub.unload(name)
        served, reason = (gone.spec.name if gone else name), "unload"
    else:
        async with front.hub.lease(name) as gen:
            served, reason = gen.spec.name, "load"
        _keep_alive(request, served, keep_alive_s)
    body: dict[str, Any] = {"model": served, "created_at": now_rfc3339(),
                            **({"message": {"role": "assistant", "content": ""}} if chat
                               else {"response": ""}),
                            "done": True, "done_reason": reason}

    async def frames() -> AsyncIterator[str]:
        yield ndjson_line(body)

    async def collect() -> dict[str, Any]:
        return body

    return Answer([], stream, frames, collect)


async def start_chat(request: Request, body: wire.ChatRequest) -> Answer:
    clock = Clock.start()
    keep_alive_s = keep_alive_seconds(body.keep_alive)
    if not body.messages:
        options_of(body.options)  # still refuse what cannot be honoured
        return await _load_only(request, model_name(body.model), body.stream, True, keep_alive_s)
    gen = await translated(request, chat_request, body)
    return await _answer(request, gen, options_of(body.options).num_ctx, clock, True, keep_alive_s)


async def _fim_prompt(request: Request, body: wire.GenerateRequest) -> str:
    """Rule 5: `suffix` as fill-in-the-middle through the model's FIM tokens, else 400."""
    name = model_name(body.model)
    style = await fim_style(frontend(request), name)
    if style is None:
        markers = ", ".join(s[0] for s in FIM_STYLES)
        raise UnsupportedField("suffix", f"needs fill-in-the-middle tokens ({markers}, ...) "
                               f"in the model's vocabulary; the model '{name}' has none")
    pre, suf, mid, _ = style
    return f"{pre}{body.prompt or ''}{suf}{body.suffix}{mid}"


async def start_generate(request: Request, body: wire.GenerateRequest) -> Answer:
    clock = Clock.start()
    num_ctx = options_of(body.options).num_ctx
    keep_alive_s = keep_alive_seconds(body.keep_alive)
    if body.suffix:
        gen = generate_request(body, await _fim_prompt(request, body))
    elif not body.prompt:
        generate_request(body)  # still refuse what cannot be honoured
        return await _load_only(request, model_name(body.model), body.stream, False,
                                keep_alive_s)
    else:
        gen = generate_request(body)
    return await _answer(request, gen, num_ctx, clock, False, keep_alive_s)


chat = generating(OLLAMA, wire.ChatRequest, start_chat)
generate_route = generating(OLLAMA, wire.GenerateRequest, start_generate)


def _inputs(raw: str | list[str]) -> list[str]:
    inputs = [raw] if isinstance(raw, str) else list(raw)
    if not inputs:
        raise InvalidRequest("'input' must not be empty.", param="input")
    for i, text in enumerate(inputs):
        if not text:
            raise InvalidRequest(f"'input[{i}]' is empty.", param=f"input[{i}]")
    return inputs


@endpoint(ollama_error)
async def embed(request: Request) -> Response:
    """Rule 6: /api/embed (truncating by default) and the legacy /api/embeddings."""
    started = time.perf_counter_ns()
    body = await decode_body(request, wire.EmbedRequest)
    options_of(body.options)
    keep_alive_s = keep_alive_seconds(body.keep_alive)
    result = await frontend(request).embed(
        model_name(body.model), _inputs(body.input), truncate=body.truncate,
        dimensions=body.dimensions)
    _keep_alive(request, result.model, keep_alive_s)
    note_generation(request, model=result.model, prompt_tokens=result.num_tokens)
    return json_response({"model": result.model,
                          "embeddings": [v.tolist() for v in result.vectors],
                          "total_duration": time.perf_counter_ns() - started,
                          "prompt_eval_count": result.num_tokens})


@endpoint(ollama_error)
async def embeddings(request: Request) -> Response:
    """Rule 6, legacy form."""
    body = await decode_body(request, wire.EmbeddingsRequest)
    options_of(body.options)
    keep_alive_s = keep_alive_seconds(body.keep_alive)
    if not body.prompt:
        return json_response({"embedding": []})
    result = await frontend(request).embed(model_name(body.model), [body.prompt],
                                                 truncate=True)
    _keep_alive(request, result.model, keep_alive_s)
    note_generation(request, model=result.model, prompt_tokens=result.num_tokens)
    return json_response({"embedding": result.vectors[0].tolist()})


routes: list[BaseRoute] = [
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/generate", generate_route, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings, methods=["POST"]),
    *models.routes,
]
