"""POST /v1/completions: raw prompts (text, token ids, or a batch of either); the
translation is translate.py's, the frames frames.py's.

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

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from ...http.frontend import frontend
from ..endpoint import Answer, generate, generating
from . import wire
from .chat import OPENAI
from .frames import Echo, collect_all, completion_body, completion_frames
from .translate import to_gen_requests

if TYPE_CHECKING:
    from ...serving.handles import Run


async def _abort_all(runs: list[Run]) -> None:
    for run in runs:
        await run.abort()


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
