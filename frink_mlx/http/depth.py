"""How deep a request body may nest, and naming the field where it nests too deep.

Why: the values typed `Any` (tool `parameters`, JSON Schemas, tool-call
arguments, `metadata`) are opaque to the wire structs, and whatever walks them
later -- the chat template's `tojson`, the schema checks, the grammar builder
-- recurses. A `tools[0].function.parameters` nested 100,000 deep made
msgspec's decoder raise RecursionError, a 500 with a traceback; one nested 900
deep would decode and then exhaust the stack further on. So:

1. A body nests at most MAX_JSON_DEPTH arrays and objects (the root object is
   level 1). Deeper is a 400 whose `param` names the field, as rule 1 of
   http/fields.py names unknown fields (list positions folded: `tools[]`).
2. The check costs nothing for the typed parts of a body (their depth is fixed
   by the structs) and one iterative pass over the containers under `Any`
   fields (`too_deep`), run while http/fields.py walks the body anyway; scalars
   are never looked at one by one beyond their type.
3. A body so deep that msgspec gives up (RecursionError, past about a
   thousand levels) cannot be decoded at all; its raw bytes are scanned
   (`path_past`, at most SCAN_BYTES of them, so the refusal stays cheap) for
   the path where it first goes past the limit, and http/fields.py cuts that
   path at the field the structs declare. Past the scanned prefix the refusal
   names no field.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InvalidRequest

MAX_JSON_DEPTH = 128
SCAN_BYTES = 1 << 20
# A string (with its escapes; a key when a colon follows) or one bracket.
_TOKEN = re.compile(rb'"((?:[^"\\]++|\\.)*+)"(\s*+:)?|[\[\]{}]')


def too_deep(value: Any, budget: int) -> bool:
    """Rule 2: True when `value` holds more than `budget` levels of containers."""
    if type(value) not in (dict, list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if level > budget:
            return True
        children = node.values() if type(node) is dict else node
        kinds = set(map(type, children))   # at C speed: most containers hold scalars only
        if dict in kinds or list in kinds:
            stack.extend((child, level + 1) for child in children
                         if type(child) is dict or type(child) is list)  # what JSON decodes to
    return False


def path_past(data: bytes, limit: int = MAX_JSON_DEPTH) -> list[str] | None:
    """Rule 3: the path (keys, and `[]` for list items) to the first container past
    `limit` levels in the first SCAN_BYTES of `data`; None when none is found there."""
    path: list[str] = []       # one component per open container below the root
    key: str | None = None     # the last key read in the innermost open object
    kinds: list[bytes] = []    # b"{" or b"[" per open container
    for match in _TOKEN.finditer(data, 0, min(len(data), SCAN_BYTES)):
        token = match.group(0)
        if token[:1] == b'"':
            if match.group(2):
                key = match.group(1).decode("utf-8", "replace")
            continue
        if token in (b"[", b"{"):
            if kinds:
                path.append("[]" if kinds[-1] == b"[" else key or "")
            kinds.append(token)
            if len(kinds) > limit:
                return path
        elif kinds:
            kinds.pop()
            if path:
                path.pop()
    return None


def joined(path: list[str]) -> str:
    """['tools', '[]', 'function'] -> 'tools[].function'."""
    out = ""
    for part in path:
        out += part if part == "[]" else (f".{part}" if out else part)
    return out


def depth_error(param: str | None) -> InvalidRequest:
    where = f"'{param}'" if param else "The request body"
    return InvalidRequest(f"{where} nests deeper than {MAX_JSON_DEPTH} levels of arrays and "
                          "objects.", param=param or None)
