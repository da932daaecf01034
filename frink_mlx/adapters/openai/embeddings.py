"""POST /v1/embeddings (OpenAI): wire structs, translation, route.

The route only decodes, translates and renders; `Frontend.embed` picks the
encoder (active encoder, side-car, or an explicit "self") and runs the padded
batches off the event loop (engine/encoder/service.py).

Protocol rules:
1. `input` is a string, an array of strings, an array of token ids, or an
   array of token-id arrays (at most 2048 items); mixing the shapes, an empty
   array or an empty string is a 400 naming `input` / `input[i]`.
   Token ids are embedded verbatim: no special tokens are added -- and only when
   the request says they are this model's own ids (`"native_token_ids": true`,
   an extension; the ids /tokenize returns). Clients that send token ids
   unasked (LangChain's OpenAIEmbeddings sends tiktoken cl100k ids by default)
   would otherwise get vectors of unrelated tokens that look like real ones;
   without the flag token-id input is a 400 naming `input` that says how to
   send text instead.
2. `encoding_format`: "float" (JSON numbers) or "base64" (the little-endian
   float32 bytes of each vector, base64-encoded, as OpenAI sends them; the
   `openai` Python SDK asks for base64 by default and decodes it itself).
3. `dimensions`: accepted when equal to the model's width; shorter only for
   models registered as Matryoshka-trained (`matryoshka = true` in models.toml),
   which are cut and re-normalised; otherwise refused by name (UnsupportedField).
4. An input longer than the encoder's max length is a 400 naming `input[i]`,
   its token count and the limit -- unless the request sends the extension
   field `"truncate": true`, which cuts it to the limit (keeping special tokens
   for text inputs).
5. `usage.prompt_tokens` = `usage.total_tokens` = tokens embedded (with special
   tokens, after any requested truncation). `model` names the encoder that
   made the vectors, so a client that sent the chat model's name learns which
   side-car answered.
6. `user` is accepted (an end-user id for the client's own tracking) and has
   no effect; `pooling` (vLLM / llama.cpp) is refused by name (the pooling is
   the model's own); other unknown fields are reported (http/fields.py).
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, Sequence

import msgspec
import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...errors import InvalidRequest, UnsupportedField
from ...http.access import note_generation
from ...http.body import decode_body
from ...http.errors import endpoint, openai_error
from ...http.frontend import frontend
from ..endpoint import json_response

MAX_INPUTS = 2048

TokenIds = list[int]


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=False, kw_only=True):
    input: str | list[str | int | TokenIds]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None
    truncate: bool = False  # extension (rule 4)
    native_token_ids: bool = False  # extension (rule 1)
    pooling: str | None = None      # refused by name (rule 6)


class Embedding(msgspec.Struct, kw_only=True):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingsUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(msgspec.Struct, kw_only=True):
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage
    object: str = "list"


_SHAPES = ("'input' must be a string, an array of strings, an array of token ids or an "
           "array of token-id arrays")


def to_inputs(body: EmbeddingsRequest) -> list[str] | list[list[int]]:
    """Rule 1: one of the four shapes -> a list of texts or a list of id lists.

    input[0] decides the shape; the first item that does not fit it is named."""
    raw = body.input
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif not raw:
        raise InvalidRequest("'input' must not be an empty array.", param="input")
    elif isinstance(raw[0], int):
        _check_all(raw, int, "a token id like input[0]")
        items = [list(raw)]
    else:
        _check_all(raw, type(raw[0]), "of the same shape as input[0]")
        items = list(raw)
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"'input' holds {len(items)} items; at most {MAX_INPUTS} are "
                             "allowed per request.", param="input")
    for index, item in enumerate(items):
        if len(item) == 0:
            raise InvalidRequest(f"input[{index}] is empty.", param=f"input[{index}]")
    if not isinstance(items[0], str) and not body.native_token_ids:
        raise InvalidRequest(
            "'input' holds token ids, but token ids from another tokenizer (e.g. tiktoken's, "
            "which LangChain's OpenAIEmbeddings sends by default) would embed unrelated tokens. "
            "Send text (LangChain: check_embedding_ctx_length=False), or set "
            "\"native_token_ids\": true if the ids come from this model's own /tokenize.",
            param="input", code="token_ids_not_native")
    return items


def _check_all(raw: Sequence[Any], kind: type, what: str) -> None:
    for index, item in enumerate(raw):
        if type(item) is not kind:
            raise InvalidRequest(f"{_SHAPES}; input[{index}] is not {what}.",
                                 param=f"input[{index}]")


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """Rule 2: a vector as JSON floats, or its little-endian float32 bytes in base64."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return np.asarray(vector, dtype=np.float32).tolist()


def to_response(model: str, vectors: Sequence[np.ndarray], num_tokens: int,
                encoding_format: str) -> EmbeddingsResponse:
    data = [Embedding(index=i, embedding=encode_vector(v, encoding_format))
            for i, v in enumerate(vectors)]
    return EmbeddingsResponse(data=data, model=model,
                              usage=EmbeddingsUsage(prompt_tokens=num_tokens,
                                                    total_tokens=num_tokens))


@endpoint(openai_error)
async def create_embeddings(request: Request) -> Response:
    body = await decode_body(request, EmbeddingsRequest)
    if body.pooling is not None:
        raise UnsupportedField("pooling", "cannot be chosen per request (each model pools "
                               "as it was trained)")
    inputs = to_inputs(body)
    result = await frontend(request).embed(
        body.model, inputs, truncate=body.truncate, dimensions=body.dimensions)
    note_generation(request, model=result.model, prompt_tokens=result.num_tokens)
    response = to_response(result.model, list(result.vectors), result.num_tokens,
                           body.encoding_format)
    return json_response(response)


routes: list[BaseRoute] = [
    Route("/v1/embeddings", create_embeddings, methods=["POST"]),
    Route("/embeddings", create_embeddings, methods=["POST"]),   # llama-server's alias
]
