"""POST /v1/chat/completions: wire struct -> GenRequest (translate.py) -> events -> OpenAI
JSON / chunks (frames.py, whose rules say how the chunks go out).

Rules:
1. Everything that can fail (decoding, refusals, template, context ceiling,
   grammar) fails before the first SSE byte, as a real status code.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from ...http.errors import llama_server_openai_error, openai_error
from ..endpoint import Answer, Protocol, generate, generating, translated
from . import wire
from .frames import chat_body, chat_frames, collect
from .translate import to_gen_request

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
