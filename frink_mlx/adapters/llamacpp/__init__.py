"""llama.cpp server API: /completion (+ /completions), /infill, /tokenize, /detokenize.

Paths have no /v1 prefix (those are OpenAI's). translate.py holds the
field rules; this module resolves prompts and vocabulary through AppState:
1. A mixed prompt (`[12, "text", 34]`) becomes ids: each string piece is
   tokenized without special tokens except the first piece of a prompt that
   starts with text, which gets BOS as a plain string prompt would.
2. /infill looks up the fill-in-the-middle markers of the model's vocabulary
   (each must be ONE token of exactly that text); without them it answers 501
   naming the markers it looked for.
3. Errors leave in llama.cpp's envelope `{"error": {"code", "message", "type"}}`.
4. Streams are bare `data:` frames; the last has `stop: true`; no `[DONE]`.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...core.events import choice_events, drain_choice
from ...errors import NotSupported, UnsupportedField
from ...http.body import decode_body
from ...http.errors import endpoint, llamacpp_error
from ...http.sse import sse_frame
from ..endpoint import Answer, Protocol, generate, generating
from . import wire
from .translate import FIM_STYLES, CompletionBuilder, check_prompt, infill_prompt, to_gen_request

LLAMACPP = Protocol("llamacpp", llamacpp_error)


async def resolve_prompt(state: Any, model: str | None, prompt: str | list[int | str]
                         ) -> str | list[int | str]:
    """Rule 1."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    ids: list[int | str] = []
    for i, piece in enumerate(prompt):
        if isinstance(piece, str):
            ids += await state.tokenize(model, piece, add_special=i == 0)
        else:
            ids.append(piece)
    return ids


async def fim_style(state: Any, model: str | None) -> tuple[str, str, str, str | None] | None:
    """Rule 2: the first FIM marker set whose markers are single tokens of the vocabulary."""

    async def is_token(marker: str) -> bool:
        ids = await state.tokenize(model, marker, add_special=False)
        return len(ids) == 1 and (await state.token_pieces(model, ids)) == [marker]

    for pre, suf, mid, sep in FIM_STYLES:
        if await is_token(pre) and await is_token(suf) and await is_token(mid):
            return pre, suf, mid, sep if sep and await is_token(sep) else None
    return None


async def _stream(run: Any, builder: CompletionBuilder) -> AsyncIterator[str]:
    async for event in choice_events(run.events()):
        for frame in builder.feed(event):
            yield sse_frame(json.dumps(frame, ensure_ascii=False))


async def _collect(run: Any, builder: CompletionBuilder) -> dict[str, Any]:
    await drain_choice(run.events(), builder.feed)
    return builder.result()


async def _answer(request: Request, body: wire._Sampling, prompt: str | list[int | str]
                  ) -> Answer:
    (run,) = await generate(request, [to_gen_request(body, prompt)])
    builder = CompletionBuilder(run.model, prompt if isinstance(prompt, str) else None)
    return Answer([run], body.stream, lambda: _stream(run, builder),
                  lambda: _collect(run, builder))


async def start_completion(request: Request, body: wire.CompletionRequest) -> Answer:
    check_prompt(body.prompt)
    prompt = await resolve_prompt(request.app.state.frink, body.model, body.prompt)
    return await _answer(request, body, prompt)


async def start_infill(request: Request, body: wire.InfillRequest) -> Answer:
    style = await fim_style(request.app.state.frink, body.model)
    if style is None:
        names = ", ".join(s[0] for s in FIM_STYLES)
        raise NotSupported(f"/infill needs fill-in-the-middle tokens ({names}, ...) in the "
                           f"model's vocabulary; the model '{body.model or 'default'}' has none.",
                           code="fim_not_supported")
    return await _answer(request, body, infill_prompt(body, style))


completion = generating(LLAMACPP, wire.CompletionRequest, start_completion)
infill = generating(LLAMACPP, wire.InfillRequest, start_infill)


@endpoint(llamacpp_error)
async def tokenize(request: Request) -> Response:
    body = await decode_body(request, wire.TokenizeRequest)
    if not body.parse_special:
        raise UnsupportedField("parse_special", "cannot be false: special-token text is always "
                               "parsed as the special token")
    state = request.app.state.frink
    ids = await state.tokenize(body.model, body.content, add_special=body.add_special)
    if not body.with_pieces:
        return JSONResponse({"tokens": ids})
    pieces = await state.token_pieces(body.model, ids)
    return JSONResponse({"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces)]})


@endpoint(llamacpp_error)
async def detokenize(request: Request) -> Response:
    body = await decode_body(request, wire.DetokenizeRequest)
    content = await request.app.state.frink.detokenize(body.model, body.tokens)
    return JSONResponse({"content": content})


routes: list[BaseRoute] = [
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
    Route("/infill", infill, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
