"""Prompts without a generation: token counts and the rendered chat template.

Clients size a conversation before sending it (OpenAI's `POST
/v1/responses/input_tokens`; llama-server's twin for chat bodies) or ask what
the template makes of their messages (llama-server's `POST /apply-template`).
Each takes the body of the route it mirrors, renders it exactly as a
generation would -- same template, tools block, thinking switch, model routing
-- and stops there: nothing is queued or submitted.

Rules:
1. `/v1/chat/completions/input_tokens` and `/v1/responses/input_tokens` (and
   their un-prefixed aliases, as llama-server serves them) answer
   `{"object": "response.input_tokens", "input_tokens": N}`; `N` counts the
   rendered prompt's tokens, what `usage.prompt_tokens` of the same request
   would report.
2. `/apply-template` answers `{"prompt": "<rendered text>"}`, the text the
   model would be prompted with, generation prompt included unless
   `add_generation_prompt: false` or `continue_final_message` says otherwise.
3. Fields that only shape the generation (`max_tokens`, `stream`, sampling)
   are accepted and change nothing here; the same refusals as the generating
   route apply (an image part is still 400), so a count never describes a
   request the route would refuse.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...core.request import Message
from ...http.body import decode_body
from ...http.errors import endpoint, llamacpp_error, openai_error
from ...http.frontend import frontend
from ..endpoint import translated
from . import responses_wire, wire
from .responses import store_of
from .responses import to_gen_request as responses_gen_request
from .translate import to_gen_request


def _counted(num_tokens: int) -> JSONResponse:
    return JSONResponse({"object": "response.input_tokens", "input_tokens": num_tokens})


@endpoint(openai_error)
async def chat_input_tokens(request: Request) -> Response:
    """Rule 1, for a chat/completions body."""
    body = await decode_body(request, wire.ChatCompletionRequest)
    gen = await translated(request, to_gen_request, body)
    return _counted(await frontend(request).count_tokens(gen))


@endpoint(openai_error)
async def responses_input_tokens(request: Request) -> Response:
    """Rule 1, for a responses body (`previous_response_id` included)."""
    body = await decode_body(request, responses_wire.ResponsesRequest)
    history: list[Message] = []
    if body.previous_response_id is not None:
        stored = store_of(request).get(body.previous_response_id, param="previous_response_id")
        history = list(stored.messages)
    gen, _ = await translated(request, responses_gen_request, body, history, request)
    return _counted(await frontend(request).count_tokens(gen))


@endpoint(llamacpp_error)   # a llama-server path: its envelope (http/security.py)
async def apply_template(request: Request) -> Response:
    """Rule 2: `{"prompt": ...}`, the text the model would be prompted with."""
    body = await decode_body(request, wire.ChatCompletionRequest)
    gen = await translated(request, to_gen_request, body)
    return JSONResponse({"prompt": await frontend(request).render_text(gen)})


routes: list[BaseRoute] = [
    Route("/v1/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    Route("/chat/completions/input_tokens", chat_input_tokens, methods=["POST"]),
    Route("/v1/responses/input_tokens", responses_input_tokens, methods=["POST"]),
    Route("/responses/input_tokens", responses_input_tokens, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
]
