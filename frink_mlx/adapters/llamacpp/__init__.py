"""llama.cpp server API: /completion (+ /completions), /infill, /tokenize, /detokenize,
/props, /slots.

Paths have no /v1 prefix (those are OpenAI's). translate.py holds the
field rules; this module resolves prompts and vocabulary through Frontend:
1. A mixed prompt (`[12, "text", 34]`) becomes ids: each string piece is
   tokenized without special tokens except the first piece of a prompt that
   starts with text, which gets BOS as a plain string prompt would.
2. /infill looks up the fill-in-the-middle markers of the model's vocabulary
   (each must be ONE token of exactly that text); without them it answers 501
   naming the markers it looked for.
3. Errors leave in llama.cpp's envelope `{"error": {"code", "message", "type"}}`.
4. Streams are bare `data:` frames; the last has `stop: true`; no `[DONE]`.
5. `/props` and `/slots` are read-only and honest: `/props` reports the
   default generation settings, the served context (`n_ctx`), the model, its
   chat template, whether it reads images (`modalities.vision`) and the media
   marker of multimodal prompts (translate.py rule 10) -- of `?model=NAME` (as
   llama-server's router mode takes it; several models are resident at once),
   else of the model a request naming none gets; `/slots` likewise for
   `?model=`. The engine has no fixed slots, so `total_slots` is the batch
   limit, and `/slots` lists that many rows, the running sequences first
   (`is_processing: true`), the free rows after them (false) -- clients read
   `slots[0]` to see whether the server is busy. Nothing per slot is invented
   (no per-slot params or prompt: a sequence is not pinned to a row).
6. `logit_bias` may name tokens by text (`[["hello", -5]]`, `{"hello": -5}`),
   as llama-server and its clients (SillyTavern's banned strings) send it: the
   text is tokenized without special tokens and the bias applies to each of its
   tokens. Ids (numbers or digit strings) pass through as they are.
7. `ignore_eos` bans the model's end-of-generation tokens (a bias of -inf, as
   llama-server adds them): the text runs to `n_predict` without an end token
   in it. `generation_settings.logit_bias` lists every bias, a ban as null.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, AsyncIterator

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...core.checks import MAX_LOGIT_BIAS, token_id_of
from ...core.events import ErrorEvent, choice_events
from ...core.images import ImageRef
from ...core.request import GenRequest, SamplingParams
from ...errors import InvalidRequest, NotSupported, UnsupportedField
from ...http.body import decode_body
from ...http.errors import endpoint, llamacpp_error
from ...http.frontend import frontend
from ...http.sse import sse_frame
from ..endpoint import Answer, Protocol, dumps, generate, generating, merged
from . import wire
from .frames import CompletionBuilder
from .translate import (
    FIM_STYLES,
    MEDIA_MARKER,
    check_prompt,
    generation_settings,
    infill_prompt,
    split_prompts,
    to_gen_request,
)

if TYPE_CHECKING:
    from ...engine.types import EngineStats
    from ...registry import ModelSpec
    from ...serving.frontend import Frontend
    from ...serving.generation import Generation
    from ...serving.handles import Run

LLAMACPP = Protocol("llamacpp", llamacpp_error)


async def resolve_prompt(front: Frontend, model: str | None, prompt: str | list[int | str]
                         ) -> str | list[int | str]:
    """Rule 1: a mixed prompt's ids, each text piece tokenized (BOS only for a leading one);
    the pieces after the first in one Frontend.tokenize_many job, not one hop each."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    head: list[int | str] = []
    if prompt and isinstance(prompt[0], str):
        head += await front.tokenize(model, prompt[0], add_special=True)
        prompt = prompt[1:]
    texts = [piece for piece in prompt if isinstance(piece, str)]
    pieces = iter(await front.tokenize_many(model, texts, add_special=False))
    ids = head
    for piece in prompt:
        ids += next(pieces) if isinstance(piece, str) else [piece]
    return ids


async def resolve_logit_bias(front: Frontend, model: str | None,
                             raw: list[list[Any]] | dict[str, Any] | None
                             ) -> list[list[Any]] | None:
    """Rule 6: `[[text, bias]]` / `{"text": bias}` -> one `[id, bias]` per token of the text,
    every text in one Frontend.tokenize_many job."""
    if raw is None:
        return None
    if len(raw) > MAX_LOGIT_BIAS:   # before any text is tokenized (core/checks.py rule 4)
        raise InvalidRequest(f"'logit_bias' holds {len(raw)} entries; at most {MAX_LOGIT_BIAS} "
                             "are accepted.", param="logit_bias")
    pairs = [list(p) for p in raw.items()] if isinstance(raw, dict) else raw
    texts = [pair[0] for pair in pairs if _text_key(pair)]
    tokenized = iter(await front.tokenize_many(model, texts, add_special=False))
    out: list[list[Any]] = []
    for pair in pairs:
        if _text_key(pair):
            out += [[i, pair[1]] for i in next(tokenized)]
        else:
            out.append(pair)   # ids (and malformed pairs, refused by translate.py)
    return out


def _text_key(pair: Any) -> bool:
    """Rule 6: a well-formed `[text, bias]` pair whose text is not a token id."""
    return (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
            and token_id_of(pair[0]) is None)


async def fim_style(front: Frontend, model: str | None) -> tuple[str, str, str, str | None] | None:
    """Rule 2: the first FIM marker set whose markers are single tokens of the vocabulary."""

    async def is_token(marker: str) -> bool:
        ids = await front.tokenize(model, marker, add_special=False)
        return len(ids) == 1 and (await front.token_pieces(model, ids)) == [marker]

    for pre, suf, mid, sep in FIM_STYLES:
        if await is_token(pre) and await is_token(suf) and await is_token(mid):
            return pre, suf, mid, sep if sep and await is_token(sep) else None
    return None


async def _stream(run: Run, builder: CompletionBuilder) -> AsyncIterator[str]:
    async for event in choice_events(run.events()):
        for frame in builder.feed(event):
            yield sse_frame(dumps(frame))


async def _collect(runs: list[Run], builders: list[list[CompletionBuilder]],
                   fields: list[str] | None) -> dict[str, Any] | list[dict[str, Any]]:
    """One result, or one per prompt and completion (translate.py rules 7 and 9)."""
    async for k, event in merged(runs):
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        builders[k][event.index].feed(event)
    results = [b.result(fields) for row in builders for b in row]
    return results[0] if len(results) == 1 else results


def _builders(body: wire._Sampling, gen: GenRequest, run: Run, prompt: str | list[int | str],
              first_index: int) -> list[CompletionBuilder]:
    settings = {**generation_settings(body, gen, run.sampling), "model": run.model}
    return [CompletionBuilder(run.model, prompt if isinstance(prompt, str) else None,
                              prompt_tokens=run.prompt_tokens, settings=settings,
                              n_probs=body.n_probs, return_tokens=body.return_tokens,
                              warmup=body.n_predict == 0,
                              output_ids=functools.partial(run.output_ids, i),
                              context_bound=run.context_bound, first_index=first_index)
            for i in range(gen.n)]


async def _answer(request: Request, body: wire._Sampling,
                  prompts: list[str | list[int | str]],
                  images: list[list[ImageRef]] | None = None) -> Answer:
    front = frontend(request)
    if body.logit_bias or body.ignore_eos:
        bias = await resolve_logit_bias(front, body.model, body.logit_bias) or []
        if body.ignore_eos:   # rule 7
            bias += [[i, False] for i in await front.eos_token_ids(body.model)]
        body = msgspec.structs.replace(body, logit_bias=bias)
    gens = [to_gen_request(body, prompt, images[k] if images else None)
            for k, prompt in enumerate(prompts)]
    runs = await generate(request, gens)
    builders = [_builders(body, gen, run, prompt, k * gen.n)
                for k, (gen, run, prompt) in enumerate(zip(gens, runs, prompts))]
    return Answer(runs, body.stream, lambda: _stream(runs[0], builders[0][0]),
                  lambda: _collect(runs, builders, body.response_fields))


async def start_completion(request: Request, body: wire.CompletionRequest) -> Answer:
    front = frontend(request)
    prompts = split_prompts(body.prompt, stream=body.stream, n=body.n_cmpl,
                            max_n=front.config.max_batch)
    for prompt, _ in prompts:
        check_prompt(prompt)
    return await _answer(request, body,
                         [await resolve_prompt(front, body.model, p) for p, _ in prompts],
                         [images for _, images in prompts])


async def start_infill(request: Request, body: wire.InfillRequest) -> Answer:
    style = await fim_style(frontend(request), body.model)
    if style is None:
        names = ", ".join(s[0] for s in FIM_STYLES)
        raise NotSupported(f"/infill needs fill-in-the-middle tokens ({names}, ...) in the "
                           f"model's vocabulary; the model '{body.model or 'default'}' has none.",
                           code="fim_not_supported")
    return await _answer(request, body, [infill_prompt(body, style)])


completion = generating(LLAMACPP, wire.CompletionRequest, start_completion)
infill = generating(LLAMACPP, wire.InfillRequest, start_infill)


@endpoint(llamacpp_error)
async def tokenize(request: Request) -> Response:
    body = await decode_body(request, wire.TokenizeRequest)
    if not body.parse_special:
        raise UnsupportedField("parse_special", "cannot be false: special-token text is always "
                               "parsed as the special token")
    front = frontend(request)
    ids = await front.tokenize(body.model, body.content, add_special=body.add_special)
    if not body.with_pieces:
        return JSONResponse({"tokens": ids})
    pieces = await front.token_pieces(body.model, ids)
    return JSONResponse({"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces)]})


@endpoint(llamacpp_error)
async def detokenize(request: Request) -> Response:
    body = await decode_body(request, wire.DetokenizeRequest)
    content = await frontend(request).detokenize(body.model, body.tokens)
    return JSONResponse({"content": content})


def _default_settings(spec: ModelSpec | None) -> dict[str, Any]:
    """What a request naming no sampling field runs with: the model's defaults, else ours
    (0 is a real default -- greedy -- not a missing one)."""
    defaults = spec.sampling if spec is not None else None

    def default(name: str) -> Any:
        value = getattr(defaults, name, None)
        return getattr(SamplingParams(), name) if value is None else value

    return {"n_predict": -1, **{name: default(name) for name in
                                ("temperature", "top_k", "top_p", "min_p")},
            "seed": -1, "stream": False, "cache_prompt": True, "n_probs": 0}


def _described(request: Request
               ) -> tuple[Generation | None, ModelSpec | None, EngineStats | None]:
    """Rule 5: (generation or None, its spec or the registry entry's, its EngineStats or
    None) for `?model=NAME`, else for the model a request naming none gets."""
    front = frontend(request)
    name = request.query_params.get("model")
    gen = front.hub.residency.find(name) if name else front.hub.current
    spec = gen.spec if gen is not None else (front.registry.resolve(name) if name else None)
    stats = gen.engine.stats() if gen is not None and gen.engine is not None else None
    return gen, spec, stats


@endpoint(llamacpp_error)
async def props(request: Request) -> Response:
    """Rule 5: the default settings, context, model, template and modalities, read-only."""
    front = frontend(request)
    gen, spec, stats = _described(request)
    template = ""
    if gen is not None and gen.spec.kind == "generative":
        template = str(getattr(gen.loaded.tokenizer, "chat_template", None) or "")
    vision = bool(front.model_facts(spec.name)["vision"]) if spec is not None else False
    n_ctx = stats.context_ceiling if stats is not None else 0
    return JSONResponse({
        "default_generation_settings": {"n_ctx": n_ctx, "params": _default_settings(spec),
                                        "model": spec.name if spec else None},
        "total_slots": front.config.max_batch, "model_path": spec.source if spec else None,
        "model_alias": spec.name if spec else None, "chat_template": template,
        "n_ctx": n_ctx, "modalities": {"vision": vision, "audio": False},
        "media_marker": MEDIA_MARKER,
        "build_info": "frink-mlx", "is_sleeping": gen is None})


@endpoint(llamacpp_error)
async def slots(request: Request) -> Response:
    """Rule 5: one entry per row of the engine's batch, the running ones first."""
    front = frontend(request)
    _, _, stats = _described(request)
    n_ctx = stats.context_ceiling if stats is not None else 0
    running = stats.num_running if stats is not None else 0
    rows = max(front.config.max_batch, running)
    return JSONResponse([{"id": i, "n_ctx": n_ctx, "is_processing": i < running}
                         for i in range(rows)])


routes: list[BaseRoute] = [
    Route("/props", props, methods=["GET"]),
    Route("/slots", slots, methods=["GET"]),
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
    Route("/infill", infill, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
