"""POST /v1/completions: raw prompts (text, token ids, or a batch of either).

Rules:
1. `prompt` may be a string, a list of token ids, a list of strings or a list
   of token-id lists; a batch runs every prompt concurrently and numbers the
   choices `prompt_index * n + choice_index`, as OpenAI does.
2. `echo` prepends the prompt's text to each choice. `echo` with `logprobs`
   is refused by name: prompt logprobs are not computed.
3. `logprobs` is an integer 0..5 (the legacy shape): chosen-token logprobs
   plus that many alternatives, as `{tokens, token_logprobs, top_logprobs,
   text_offset}`.
4. Raw prompts are continued as text: no chat template, no markup parsing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from ...core.checks import check_batch
from ...core.events import Done, ErrorEvent, Event, TextDelta, TokenLogprob
from ...core.request import GenRequest
from ...errors import InvalidRequest, UnsupportedField
from ...http.errors import error_body
from ...http.frontend import frontend
from ..endpoint import Answer, generate, generating, merged
from . import wire
from .chat import OPENAI, ChoiceAcc, UsageSum, accumulate, dumps, finish_reason, sampling_of

if TYPE_CHECKING:
    from ...serving.frontend import Frontend
    from ...serving.handles import Run


def _prompts(prompt: Any, n: int, max_n: int) -> list[Any]:
    """Rule 1: one prompt or a batch, each a string or a token-id list; a batch is at
    most `max_n` choices (core/checks.py rule 4), checked before it is walked."""
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


@dataclass(slots=True)
class Echo:
    texts: list[str]

    async def of(self, runs: list[Run], front: Frontend) -> "Echo":
        out = []
        for run in runs:
            text = run.prompt_text
            if text is None:
                text = await front.detokenize(run.model, run.prompt_ids)
            out.append(text)
        return Echo(out)


def legacy_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in lps:
        tokens.append(lp.token)
        offsets.append(offset)
        offset += len(lp.token)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in lps],
            "text_offset": offsets}


def completion_choice(index: int, c: ChoiceAcc, prefix: str, top: int | None) -> dict[str, Any]:
    assert c.done is not None
    return {"index": index, "text": prefix + "".join(c.text), "finish_reason": finish_reason(c.done),
            "logprobs": legacy_logprobs(c.logprobs, len(prefix)) if top is not None else None}


async def collect_all(runs: list[Run]) -> dict[int, ChoiceAcc]:
    acc: dict[int, ChoiceAcc] = {}
    async for k, event in merged(runs):
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        accumulate(acc, _renumber(event, k, runs[k].n))
    return acc


def _renumber(event: Event, k: int, n: int) -> Event:
    return dataclasses.replace(event, index=k * n + event.index) if k else event


async def completion_frames(runs: list[Run], echo: Echo | None, top: int | None,
                            include_usage: bool) -> AsyncIterator[str]:
    first = runs[0]
    head = {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created,
            "model": first.model, "system_fingerprint": f"frink-g{first.generation}"}

    def frame(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return f"data: {dumps({**head, 'choices': [choice]})}\n\n"

    if echo is not None:
        for k, run in enumerate(runs):
            for j in range(run.n):
                yield frame(k * run.n + j, echo.texts[k])
    usage, offsets = UsageSum(), dict[int, int]()
    async for k, event in merged(runs):
        event = _renumber(event, k, runs[k].n)
        if isinstance(event, ErrorEvent):
            yield f"data: {dumps(error_body(event.to_error()))}\n\n"
            return
        if isinstance(event, Done):
            usage.add_done(event)
            yield frame(event.index, "", finish_reason(event))
        elif isinstance(event, TextDelta):
            lps = None
            if top is not None:
                lps = legacy_logprobs(list(event.logprobs), offsets.get(event.index, 0))
            offsets[event.index] = offsets.get(event.index, 0) + len(event.text)
            yield frame(event.index, event.text, logprobs=lps)
    if include_usage:
        yield f"data: {dumps({**head, 'choices': [], 'usage': usage.as_dict()})}\n\n"
    yield "data: [DONE]\n\n"


async def _abort_all(runs: list[Run]) -> None:
    for run in runs:
        await run.abort()


def completion_body(runs: list[Run], acc: dict[int, ChoiceAcc], echo: Echo | None,
                    top: int | None) -> dict[str, Any]:
    first, n = runs[0], runs[0].n
    usage = UsageSum()
    for k in range(len(runs)):
        u = UsageSum()
        for j in range(n):
            if acc[k * n + j].done is not None:
                u.add(acc[k * n + j].done.usage)  # type: ignore[union-attr]
        usage.prompt_tokens += u.prompt_tokens
        usage.cached_tokens += u.cached_tokens
        if u.disk_cached_tokens is not None:
            usage.disk_cached_tokens = (usage.disk_cached_tokens or 0) + u.disk_cached_tokens
        usage.completion_tokens += u.completion_tokens
        usage.add_drafts(u.draft_tokens, u.draft_accepted)
    choices = [completion_choice(i, acc[i], echo.texts[i // n] if echo else "", top)
               for i in sorted(acc)]
    return {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created,
            "model": first.model, "system_fingerprint": f"frink-g{first.generation}",
            "choices": choices, "usage": usage.as_dict()}


async def start_completions(request: Request, body: wire.CompletionRequest) -> Answer:
    reqs, top = to_gen_requests(body, max_n=frontend(request).config.max_batch)
    runs = await generate(request, reqs)
    try:
        echo = await Echo([]).of(runs, frontend(request)) if body.echo else None
    except BaseException:
        await _abort_all(runs)
        raise
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    async def body_of() -> dict[str, Any]:
        return completion_body(runs, await collect_all(runs), echo, top)

    return Answer(runs, body.stream,
                  lambda: completion_frames(runs, echo, top, include_usage), body_of)


completions = generating(OPENAI, wire.CompletionRequest, start_completions)

routes: list[BaseRoute] = [Route("/v1/completions", completions, methods=["POST"])]
