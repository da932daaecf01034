"""Request bodies -> msgspec structs, with a size limit and errors that name the field.

Rules:
1. A body over `settings.max_body_bytes` is refused with 413 -- checked against
   Content-Length first, then counted while reading (chunked uploads).
2. Bytes that are not JSON -> 400 `InvalidRequest` (no param).
3. JSON of the wrong shape -> 400 `InvalidRequest` whose `param` is the field's
   path as msgspec reports it, without the leading `$.` (e.g. `max_tokens`,
   `messages[0].content`); the message keeps msgspec's full explanation.
4. Keys the struct does not declare are reported (x-frink-ignored-fields) or,
   under --strict-fields, refused by name: http/fields.py.
5. JSON nested deeper than http/depth.py allows -> 400 naming the field, also
   when it is too deep for msgspec to decode at all (RecursionError).
6. A large body (core/offload.py rule 2: `request.state.body_bytes`, which
   `read_body` sets) is decoded and walked for unknown keys (rules 4-5) in a
   worker thread: on a body of 70,000 short messages or 20,000 tools that is
   seconds of CPU, which would otherwise hold the event loop (and /health).
"""

from __future__ import annotations

import re
from typing import TypeVar

import msgspec
from starlette.requests import Request

from ..errors import InvalidRequest, PayloadTooLarge
from .fields import find_unknown, report, too_deep_error
from .frontend import frontend_of

T = TypeVar("T")

_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_DECODERS: dict[type, msgspec.json.Decoder] = {}


def _limit(request: Request) -> int:
    front = frontend_of(request.app)
    return front.config.max_body_bytes if front is not None else 8 * 1024 * 1024


async def read_body(request: Request, max_bytes: int | None = None) -> bytes:
    """The raw body, refused with 413 past `max_bytes` (default: the app's setting)."""
    limit = _limit(request) if max_bytes is None else max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body is larger than the limit of {limit} bytes.")
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # let later request.body()/json() calls see it
    request.state.body_bytes = size  # rule 5
    return body


def validation_param(exc: msgspec.ValidationError) -> str | None:
    """The field path msgspec named in `exc`, without `$.`; None for the whole body."""
    match = _PATH.search(str(exc))
    if match is None or not match.group(1):
        return None
    return match.group(1)


def decode_struct(data: bytes, struct_type: type[T]) -> T:
    decoder = _DECODERS.get(struct_type)
    if decoder is None:
        decoder = _DECODERS[struct_type] = msgspec.json.Decoder(struct_type)
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"Invalid request body: {exc}", param=validation_param(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:   # rule 5
        raise too_deep_error(data, struct_type) from None


async def decode_body(request: Request, struct_type: type[T]) -> T:
    """Read, size-check and decode the body of `request` into `struct_type` (rules 1-6)."""
    data = await read_body(request)
    front = frontend_of(request.app)
    if front is None:
        body, unknown = _decode_checked(data, struct_type)
    else:
        body, unknown = await front.offload.run(len(data), _decode_checked, data, struct_type)
    report(request, unknown)
    return body


def _decode_checked(data: bytes, struct_type: type[T]) -> tuple[T, list[str]]:
    """The body decoded, and the names of the keys `struct_type` does not declare (rules
    4-5; pure: any thread)."""
    return decode_struct(data, struct_type), find_unknown(data, struct_type)
