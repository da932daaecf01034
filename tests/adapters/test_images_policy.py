"""core/images.py: image parts on a text-only model -- placeholder by default, or refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from frink_mlx.adapters.endpoint import _note_omitted_images
from frink_mlx.core.images import IMAGE_PLACEHOLDER
from frink_mlx.core.request import GenRequest, Message
from frink_mlx.errors import UnsupportedField


def _request() -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace())


def test_omitted_images_are_counted_for_the_header() -> None:
    request = _request()
    gen = GenRequest(model="m", messages=[Message("user", IMAGE_PLACEHOLDER)],
                     omitted_images=["messages[0].content[0]", "messages[2].content[1]"])
    _note_omitted_images(request, [gen], refuse=False)  # type: ignore[arg-type]
    assert request.state.omitted_images == 2


def test_refuse_images_names_the_first_part() -> None:
    gen = GenRequest(model="m", omitted_images=["messages[1].content[0].content[0]"])
    with pytest.raises(UnsupportedField) as err:
        _note_omitted_images(_request(), [gen], refuse=True)  # type: ignore[arg-type]
    assert err.value.param == "messages[1].content[0].content[0]"


def test_a_request_without_images_is_untouched() -> None:
    request = _request()
    _note_omitted_images(request, [GenRequest(model="m")], refuse=True)  # type: ignore[arg-type]
    assert not hasattr(request.state, "omitted_images")


def test_an_entry_setting_wins_over_the_daemon_wide_one() -> None:
    """registry rule 11: `refuse_images` per entry; unset entries follow the setting."""
    from frink_mlx.app import AppState
    from frink_mlx.registry import ModelSpec, Registry
    from frink_mlx.settings import Settings

    registry = Registry(entries={"strict": ModelSpec("strict", "x", refuse_images=True),
                                 "lenient": ModelSpec("lenient", "y", refuse_images=False),
                                 "plain": ModelSpec("plain", "z")}, default="plain", path="-")
    for everywhere in (False, True):
        state = AppState(Settings.load(refuse_images=everywhere), registry, hub=None)  # type: ignore[arg-type]
        assert state.refuses_images("strict") and not state.refuses_images("lenient")
        assert state.refuses_images("plain") is everywhere
        assert state.refuses_images(None) is everywhere
