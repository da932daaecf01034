"""/v1/embeddings `input` shapes: a mixed or empty shape is a 400 naming the item (never a 500)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from frink_mlx.adapters.openai.embeddings import EmbeddingsRequest, to_inputs
from frink_mlx.errors import InvalidRequest


@pytest.mark.parametrize("raw,param", [
    ([0, []], "input[1]"), ([0, "x"], "input[1]"), (["a", 1], "input[1]"),
    ([[1], "a"], "input[1]"), (["a", ["b"]], "input[1]"), ([[1], []], "input[1]"),
    (["a", ""], "input[1]"), ([], "input"), ([""], "input[0]"), ([[]], "input[0]"),
])
def test_bad_shapes_name_the_item(raw: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        to_inputs(EmbeddingsRequest(input=raw))
    assert err.value.param == param


@pytest.mark.parametrize("raw,expected", [
    ("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1, 2], [3]], [[1, 2], [3]]),
])
def test_the_four_shapes(raw: Any, expected: Any) -> None:
    # token ids count only when declared the model's own (issue 23)
    assert to_inputs(EmbeddingsRequest(input=raw, native_token_ids=True)) == expected


@pytest.mark.parametrize("body", [b'{"input":[true]}', b'{"input":[[1,"a"]]}',
                                  b'{"input":[[1.5]]}', b'{"input":[[[1]]]}'])
def test_nested_non_ints_and_bools_fail_decoding(body: bytes) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(body, type=EmbeddingsRequest)
