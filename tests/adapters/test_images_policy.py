"""core/images.py: image parts on a text-only model -- placeholder by default, or refused."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from frink_mlx.adapters.endpoint import note_omitted_images
from frink_mlx.core.images import IMAGE_PLACEHOLDER, ImageRef, attach_images, from_url
from frink_mlx.core.request import GenRequest, Message
from frink_mlx.errors import UnsupportedField
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.serving.frontend import Frontend
from frink_mlx.settings import Settings


def _request() -> SimpleNamespace:
    return SimpleNamespace(state=SimpleNamespace())


PARTS = [ImageRef("messages[0].content[0]"), ImageRef("messages[2].content[1]")]


def test_omitted_images_are_counted_for_the_header() -> None:
    request = _request()
    gen = GenRequest(model="m", messages=[Message("user", IMAGE_PLACEHOLDER)], images=PARTS)
    note_omitted_images(request, gen)  # type: ignore[arg-type]
    assert request.state.omitted_images == 2


def _state(refuse: bool) -> Frontend:
    registry = Registry(entries={"m": ModelSpec("m", "x")}, default="m", path="-")
    return Frontend(Settings.load(refuse_images=refuse).frontend_config(), registry, hub=None)  # type: ignore[arg-type]


def test_refuse_images_names_the_first_part_on_a_text_only_model() -> None:
    text_only = SimpleNamespace(vision=None, prepare=lambda req, limits: "prepared")
    gen = GenRequest(model="m", images=PARTS)
    with pytest.raises(UnsupportedField) as err:
        asyncio.run(_state(True)._prepare(text_only, gen))  # type: ignore[arg-type]
    assert err.value.param == "messages[0].content[0]"
    assert asyncio.run(_state(False)._prepare(text_only, gen)) == "prepared"  # type: ignore[arg-type]
    vision = SimpleNamespace(vision=object(), prepare=lambda req, limits: "read")
    assert asyncio.run(_state(True)._prepare(vision, gen)) == "read"  # type: ignore[arg-type]


def test_attach_images_hands_each_message_its_own() -> None:
    """core/images.py rule 1: in order; a message that already holds its images keeps them."""
    kept = [ImageRef("earlier")]
    messages = [Message("user", IMAGE_PLACEHOLDER, images=kept), Message("user", "text"),
                Message("user", IMAGE_PLACEHOLDER * 2), Message("tool", IMAGE_PLACEHOLDER)]
    attach_images(messages, [*PARTS, ImageRef("messages[3].content[0]")])
    assert messages[0].images == kept and messages[1].images == []
    assert messages[2].images == PARTS
    assert [r.path for r in messages[3].images] == ["messages[3].content[0]"]


def test_data_urls_and_remote_urls() -> None:
    ref = from_url("p", "data:image/png;base64,AAAA")
    assert (ref.data, ref.media_type, ref.url) == ("AAAA", "image/png", None)
    assert from_url("p", "https://example.com/a.png").url == "https://example.com/a.png"


def test_an_entry_setting_wins_over_the_daemon_wide_one() -> None:
    """registry rule 11: `refuse_images` per entry; unset entries follow the setting."""
    registry = Registry(entries={"strict": ModelSpec("strict", "x", refuse_images=True),
                                 "lenient": ModelSpec("lenient", "y", refuse_images=False),
                                 "plain": ModelSpec("plain", "z")}, default="plain", path="-")
    for everywhere in (False, True):
        state = Frontend(Settings.load(refuse_images=everywhere).frontend_config(), registry,
                         hub=None)  # type: ignore[arg-type]
        assert state.refuses_images("strict") and not state.refuses_images("lenient")
        assert state.refuses_images("plain") is everywhere
        assert state.refuses_images(None) is everywhere
