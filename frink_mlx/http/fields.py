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
   `metadata`) are opaque: nothing under them is reported. Their nesting is
   bounded though, in the same walk (http/depth.py rules 1-2).
6. Parts of a request an adapter knows and drops on purpose (a Responses
   hosted tool it cannot run: `tools[4]`) go into the same header and a log
   line (`note_dropped`); --strict-fields does not refuse them.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from msgspec import inspect as mi
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import InvalidRequest, UnsupportedField
from .depth import MAX_JSON_DEPTH, depth_error, joined, path_past, too_deep
from .frontend import frontend_of

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
    """Rule 1: paths of the keys in `raw` that `struct_type` does not declare; raises
    InvalidRequest where `raw` nests too deep (rule 5, http/depth.py)."""
    out: list[str] = []
    _walk(raw, _info(struct_type), prefix, out, 0)
    return sorted(set(out))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _nests(value: Any) -> bool:
    """A container (what JSON decodes to): only these hold fields or depth."""
    return type(value) is dict or type(value) is list


def _walk(raw: Any, info: mi.Type, path: str, out: list[str], level: int) -> None:
    """`level`: how many containers enclose `raw` in the body. Only containers are
    visited: a scalar holds neither fields nor depth."""
    if isinstance(info, mi.StructType):
        if type(raw) is dict:
            _walk_struct(raw, info, path, out, level)
    elif isinstance(info, mi.UnionType):
        _walk_union(raw, info, path, out, level)
    elif isinstance(info, mi.AnyType) or _opaque(info):   # opaque (rule 5): only its depth
        if too_deep(raw, MAX_JSON_DEPTH - level):
            raise depth_error(path)
    elif isinstance(info, (mi.ListType, mi.TupleType, mi.VarTupleType)) and type(raw) is list:
        item = getattr(info, "item_type", None)
        if item is None or not _may_nest(item):   # list[str], list[int]: nothing to walk
            return
        for value in raw:
            if _nests(value):
                _walk(value, item, f"{path}[]", out, level + 1)
    elif isinstance(info, mi.DictType) and type(raw) is dict:
        for key, value in raw.items():
            if _nests(value):
                _walk(value, info.value_type, f"{path}.{key}" if path else str(key), out,
                      level + 1)


def _walk_struct(raw: dict[str, Any], info: mi.StructType, path: str, out: list[str],
                 level: int) -> None:
    fields = _fields(info)
    for key, value in raw.items():
        field = fields.get(key)
        if field is None:
            if key != info.tag_field:
                out.append(_join(path, key))
                if too_deep(value, MAX_JSON_DEPTH - level - 1):
                    raise depth_error(_join(path, key))
        elif _nests(value):
            _walk(value, field.type, _join(path, key), out, level + 1)


_FIELDS: dict[int, dict[str, mi.Field]] = {}


def _fields(info: mi.StructType) -> dict[str, mi.Field]:
    """A struct's fields by wire name (the infos live in _INFO, so their ids are stable)."""
    fields = _FIELDS.get(id(info))
    if fields is None:
        fields = _FIELDS[id(info)] = {f.encode_name: f for f in info.fields}
    return fields


_NESTING = (mi.StructType, mi.DictType, mi.ListType, mi.TupleType, mi.VarTupleType, mi.AnyType)


def _may_nest(info: mi.Type) -> bool:
    """Whether a value of this type can hold fields or containers at all."""
    members = info.types if isinstance(info, mi.UnionType) else (info,)
    return any(isinstance(m, _NESTING) for m in members)


def _opaque(info: mi.Type) -> bool:
    """`dict[str, Any]` / `list[Any]`: nothing under it is a declared field."""
    if isinstance(info, mi.DictType):
        return isinstance(info.value_type, mi.AnyType)
    return isinstance(info, mi.ListType) and isinstance(info.item_type, mi.AnyType)


def declared_field(path: list[str], struct_type: Any) -> str:
    """The start of `path` (http/depth.py `path_past`) up to the first value the structs
    leave opaque (`Any`) or do not declare: the field to name."""
    info: mi.Type | None = _info(struct_type)
    taken: list[str] = []
    for part in path:
        info = _child(info, part)
        taken.append(part)
        if info is None:
            break
        members = info.types if isinstance(info, mi.UnionType) else (info,)
        if any(isinstance(m, mi.AnyType) or _opaque(m) for m in members):
            break
    return joined(taken)


def _child(info: mi.Type | None, part: str) -> mi.Type | None:
    members = info.types if isinstance(info, mi.UnionType) else (info,)
    for member in members:
        if part == "[]" and isinstance(member, (mi.ListType, mi.VarTupleType)):
            return member.item_type
        if part != "[]" and isinstance(member, mi.DictType):
            return member.value_type
        if part != "[]" and isinstance(member, mi.StructType):
            field = next((f for f in member.fields if f.encode_name == part), None)
            return field.type if field is not None else None
        if isinstance(member, mi.AnyType):
            return member
    return None


def _walk_union(raw: Any, info: mi.UnionType, path: str, out: list[str], level: int) -> None:
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
        _walk(raw, member, path, out, level)


def check_unknown(request: Request | None, data: bytes, struct_type: Any) -> None:
    """Rules 2-3 for a decoded body: report (or refuse) its unknown fields; rule 5's
    depth bound."""
    report(request, find_unknown(data, struct_type))


def find_unknown(data: bytes, struct_type: Any) -> list[str]:
    """The unknown fields of a body that decoded as `struct_type` (pure: any thread);
    raises InvalidRequest where it nests too deep."""
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return []
    except RecursionError:
        raise too_deep_error(data, struct_type) from None
    return unknown_fields(raw, struct_type)


def too_deep_error(data: bytes, struct_type: Any) -> InvalidRequest:
    """http/depth.py rule 3: a body too deep to decode, refused naming its field."""
    path = path_past(data)
    return depth_error(declared_field(path, struct_type) if path else None)


def report(request: Request | None, names: list[str]) -> None:
    """Refuse the first of `names` under --strict-fields, else note them for the header."""
    if not names:
        return
    front = frontend_of(request.app) if request is not None else None
    if front is not None and front.config.strict_fields:
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
