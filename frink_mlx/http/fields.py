"""Unknown request fields: found, reported in a header and a log line, or refused.

Clients send fields newer than our wire structs (Codex's `prompt_cache_key`,
llama.vim's `t_max_prompt_ms`, ...). llama-server and OpenAI ignore what they
do not know; refusing them broke every such client on its first request. The
policy (the per-route table in adapters/fields.py documents every known field):

1. Wire structs never forbid unknown fields; after a body decodes, the raw JSON
   is walked against the struct's type (`unknown_fields`) and every key no
   struct declares is collected by path (`input_extra[].time`: list indexes
   are folded, so one name stands for every element).
2. Default: the request proceeds; the names go into the response header
   `x-frink-ignored-fields` (comma-separated, sorted) and one log line.
3. `--strict-fields` (Settings.strict_fields): the first unknown field is a 400
   `unsupported_field` naming its path instead.
4. Fields we know but cannot honour are not "unknown": the adapters declare them
   and refuse them by name where ignoring them would change the answer.
5. Values typed `Any` or `dict[str, Any]` (JSON Schemas, tool arguments,
   `metadata`) are opaque: nothing under them is reported.
6. Parts of a request an adapter knows and drops on purpose (a Responses
   hosted tool it cannot run: `tools[4]`) go into the same header and a log
   line (`note_dropped`); --strict-fields does not refuse them.
"""

from __future__ import annotations

import logging
from typing import Any

from msgspec import inspect as mi
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import UnsupportedField

log = logging.getLogger("frink_mlx.fields")

HEADER = "x-frink-ignored-fields"
_STATE_KEY = "frink_ignored_fields"
_INFO: dict[Any, mi.Type] = {}


def _info(struct_type: Any) -> mi.Type:
    info = _INFO.get(struct_type)
    if info is None:
        info = _INFO[struct_type] = mi.type_info(struct_type)
    return info


def unknown_fields(raw: Any, struct_type: Any, prefix: str = "") -> list[str]:
    """Rule 1: paths of the keys in `raw` that `struct_type` does not declare."""
    out: list[str] = []
    _walk(raw, _info(struct_type), prefix, out)
    return sorted(set(out))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _walk(raw: Any, info: mi.Type, path: str, out: list[str]) -> None:
    if isinstance(info, mi.UnionType):
        _walk_union(raw, info, path, out)
    elif isinstance(info, mi.StructType) and isinstance(raw, dict):
        fields = {f.encode_name: f for f in info.fields}
        for key, value in raw.items():
            if key == info.tag_field:
                continue
            field = fields.get(key)
            if field is None:
                out.append(_join(path, key))
            else:
                _walk(value, field.type, _join(path, key), out)
    elif isinstance(info, (mi.ListType, mi.TupleType, mi.VarTupleType)) and isinstance(raw, list):
        item = getattr(info, "item_type", None)
        for value in raw:
            if item is not None:
                _walk(value, item, f"{path}[]", out)
    elif isinstance(info, mi.DictType) and isinstance(raw, dict):
        for key, value in raw.items():
            _walk(value, info.value_type, f"{path}.{key}" if path else str(key), out)


def _walk_union(raw: Any, info: mi.UnionType, path: str, out: list[str]) -> None:
    """The member `raw` decoded as: by tag for tagged structs, else by JSON shape."""
    members = [t for t in info.types if not isinstance(t, mi.NoneType)]
    if isinstance(raw, dict):
        structs = [t for t in members if isinstance(t, mi.StructType)]
        tagged = [t for t in structs if t.tag_field is not None]
        if tagged:
            tag = raw.get(tagged[0].tag_field)
            structs = [t for t in tagged if t.tag == tag] or structs
        chosen: list[mi.Type] = [*structs[:1]] or [
            t for t in members if isinstance(t, mi.DictType)]
    elif isinstance(raw, list):
        chosen = [*[t for t in members if isinstance(t, (mi.ListType, mi.TupleType,
                                                          mi.VarTupleType))][:1]]
    else:
        chosen = []
    for member in chosen:
        _walk(raw, member, path, out)


def report(request: Request | None, names: list[str]) -> None:
    """Refuse the first of `names` under --strict-fields, else note them for the header."""
    if not names:
        return
    state = getattr(request.app.state, "frink", None) if request is not None else None
    if state is not None and state.settings.strict_fields:
        raise UnsupportedField(names[0], "is not a field this server knows (--strict-fields "
                               "refuses unknown fields)")
    _note(request, names, "ignored unknown fields")


def note_dropped(request: Request | None, names: list[str], why: str) -> None:
    """Rule 6: known parts of a request dropped on purpose, noted in the header (never
    refused, not even under --strict-fields)."""
    _note(request, names, f"dropped ({why})")


def _note(request: Request | None, names: list[str], what: str) -> None:
    if request is None or not names:
        return
    noted: list[str] = request.scope.setdefault("state", {}).setdefault(_STATE_KEY, [])
    noted.extend(n for n in names if n not in noted)
    log.info("%s %s: %s %s", request.method, request.url.path, what,
             header_value(names).decode())


MAX_HEADER_NAMES = 32
MAX_NAME_CHARS = 64


def ignored_of(scope: Scope) -> list[str]:
    state = scope.get("state")
    return sorted(state.get(_STATE_KEY, [])) if isinstance(state, dict) else []


def header_value(names: list[str]) -> bytes:
    """Names as one header value: printable ASCII only (no CR/LF injection), bounded."""
    safe = ["".join(c if " " < c < "\x7f" and c != "," else "?" for c in n[:MAX_NAME_CHARS])
            for n in names[:MAX_HEADER_NAMES]]
    if len(names) > MAX_HEADER_NAMES:
        safe.append(f"...(+{len(names) - MAX_HEADER_NAMES})")
    return ",".join(safe).encode("ascii")


class IgnoredFieldsHeader:
    """Rule 2's header, added to the response start of any route that noted fields."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = ignored_of(scope)
                if names:
                    headers = list(message.get("headers", []))
                    headers.append((HEADER.encode(), header_value(names)))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_header)
