"""http/depth.py: the nesting bound of request bodies, and naming the field past it."""

from __future__ import annotations

import json

import pytest

from frink_mlx.adapters.openai import wire
from frink_mlx.errors import InvalidRequest
from frink_mlx.http.body import decode_struct
from frink_mlx.http.depth import MAX_JSON_DEPTH, SCAN_BYTES, joined, path_past, too_deep
from frink_mlx.http.fields import check_unknown, declared_field


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_too_deep_counts_containers_only() -> None:
    assert not too_deep("scalar", 0)
    assert not too_deep({"a": [1, 2, {"b": "x"}]}, 3)
    assert too_deep({"a": [1, 2, {"b": []}]}, 3)
    assert not too_deep(json.loads(_nested(50)), 50) and too_deep(json.loads(_nested(51)), 50)


def test_the_path_past_the_limit_ignores_brackets_inside_strings() -> None:
    body = '{"messages": [{"content": "[[[[ \\" {{{"}], "tools": [{"function": {"parameters": %s}}]}'
    path = path_past((body % _nested(10)).encode(), limit=5)
    assert path is not None and joined(path) == "tools[].function.parameters[]"
    assert path_past((body % _nested(1)).encode(), limit=5) is None   # exactly 5 levels
    assert declared_field(path, wire.ChatCompletionRequest) == "tools[].function.parameters"


def test_past_the_scanned_prefix_no_field_is_named() -> None:
    body = ('{"messages": [{"role": "user", "content": "%s"}], "metadata": %s}'
            % ("x" * SCAN_BYTES, _nested(100_000))).encode()
    with pytest.raises(InvalidRequest) as err:
        decode_struct(body, wire.ChatCompletionRequest)
    assert err.value.param is None and f"deeper than {MAX_JSON_DEPTH}" in err.value.message


@pytest.mark.parametrize("depth", [300, 100_000])   # decodable, and past msgspec's recursion
def test_both_ways_name_the_same_field(depth: int) -> None:
    body = json.dumps({"messages": [], "tools": [{"function": {"name": "f", "parameters": {
        "type": "object"}}}]}).replace('"object"', '"object", "x": %s' % _nested(depth)).encode()
    with pytest.raises(InvalidRequest) as err:
        decode_struct(body, wire.ChatCompletionRequest)
        check_unknown(None, body, wire.ChatCompletionRequest)
    assert err.value.param == "tools[].function.parameters"


def test_an_unknown_field_is_bounded_too() -> None:
    body = ('{"messages": [], "mystery": {"a": %s}}' % _nested(MAX_JSON_DEPTH)).encode()
    with pytest.raises(InvalidRequest) as err:
        check_unknown(None, body, wire.ChatCompletionRequest)
    assert err.value.param == "mystery"
    fine = ('{"messages": [], "mystery": {"a": %s}}' % _nested(MAX_JSON_DEPTH - 2)).encode()
    check_unknown(None, fine, wire.ChatCompletionRequest)
