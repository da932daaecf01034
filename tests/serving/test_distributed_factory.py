"""serving/distributed.py rules that need no group: what rank 0 refuses before loading."""

from __future__ import annotations

import pytest

from frink_mlx.errors import ModelFormatError
from frink_mlx.registry import ModelSpec
from frink_mlx.serving.distributed import leader_factory
from frink_mlx.settings import Settings


def test_embeddings_self_is_refused_by_name_before_any_rank_loads():
    posted: list[object] = []

    class Channel:
        def exclusive(self, *a: object) -> object:
            posted.append(a)
            raise AssertionError("nothing may be posted")

    factory = leader_factory(Channel(), object())  # type: ignore[arg-type]
    spec = ModelSpec(name="big", source="/nowhere", embeddings="self")
    with pytest.raises(ModelFormatError, match='embeddings = "self"'):
        factory(spec, Settings().hub_config(), 1, None, None)  # type: ignore[arg-type]
    assert posted == []
