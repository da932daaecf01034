"""The field policy (issue 23): one table, held to the wire structs and the README;
unknown fields reported in a header or refused under --strict-fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from msgspec import inspect as mi
from starlette.testclient import TestClient

from frink_mlx.adapters.fields import BEGIN, END, POLICY, markdown
from frink_mlx.app import create_app
from frink_mlx.http.fields import HEADER, header_value, unknown_fields
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def _field_type(info: Any, name: str) -> Any:
    """The type of field `name` of the struct inside `info` (through Optional/list)."""
    for member in getattr(info, "types", (info,)):
        member = getattr(member, "item_type", member)
        if isinstance(member, mi.StructType):
            for field in member.fields:
                if field.encode_name == name:
                    return field.type
    return None


@pytest.mark.parametrize("route", sorted(POLICY))
def test_every_declared_field_has_a_row_and_every_row_a_field(route: str) -> None:
    struct, rules = POLICY[route]
    declared = {f.encode_name for f in msgspec.structs.fields(struct)}
    top = {name for name in rules if "." not in name}
    assert declared - top == set(), f"{route}: fields without a policy row"
    assert top - declared == set(), f"{route}: rows naming no field"
    for path in (name for name in rules if "." in name):
        info: Any = mi.type_info(struct)
        for part in path.replace("[]", "").split("."):
            info = _field_type(info, part)
            assert info is not None, f"{route}: {path} is not a field"


def test_readme_carries_the_generated_table() -> None:
    text = README.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    assert text[start:end] == markdown(), "regenerate: python scripts/regen_field_table.py"


def test_unknown_fields_are_found_by_path() -> None:
    from frink_mlx.adapters.llamacpp import wire

    raw = {"prompt": "x", "mystery": 1, "input_extra": [{"text": "a", "time": [1, 2], "odd": 0}],
           "json_schema": {"anything": "goes"}}
    assert unknown_fields(raw, wire.InfillRequest) == ["input_extra[].odd", "mystery"]
    assert header_value(["a\r\nSet-Cookie: x", "b,c"]) == b"a??Set-Cookie:?x,b?c"


def test_unknown_fields_reported_in_a_header(live: Any) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "temperature": 0, "frobnicate": True, "messages_extra": {"x": 1}}
    r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200
    assert r.headers[HEADER] == "frobnicate,messages_extra"
    body = {"model": "tiny", "max_tokens": 2, "frobnicate": 1,
            "messages": [{"role": "user", "content": "hi", "weird": 1}]}
    r = httpx.post(live.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200 and r.headers[HEADER] == "frobnicate,messages[].weird"
    r = httpx.post(live.url + "/completion", json={"prompt": "x", "n_predict": 1, "zzz": 0},
                   timeout=60)
    assert r.status_code == 200 and r.headers[HEADER] == "zzz"
    r = httpx.post(live.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert HEADER not in r.headers


def test_strict_fields_refuses_by_name(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = Settings(strict_fields=True, access_log=False, cache_dir=str(tmp_path))
    registry = Registry({"tiny": ModelSpec(name="tiny", source=str(tiny_llama_dir))}, "tiny",
                        "<test>")
    app = create_app(settings, registry=registry, load_default=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "frob": 1})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "frob"
        assert r.json()["error"]["code"] == "unsupported_field"
        r = client.post("/infill", json={"input_prefix": "a", "input_extra": [
            {"text": "t", "filename": "f", "time": 3, "color": "red"}]})
        assert r.status_code == 400 and "input_extra[].color" in r.json()["error"]["message"]


def test_serve_flags_reach_the_settings() -> None:
    from frink_mlx.cli.flags import setting_fields
    from frink_mlx.cli.main import build_parser

    _SETTINGS_KEYS = setting_fields()  # the one flag table (cli/flags.py)
    args = build_parser().parse_args(["serve", "--strict-fields", "--no-fallback"])
    overrides = {k: v for k, v in vars(args).items() if k in _SETTINGS_KEYS}
    settings = Settings.load(**overrides)
    assert settings.strict_fields and settings.fallback is False
    assert Settings.load(**{k: v for k, v in vars(build_parser().parse_args(
        ["serve", "--fallback"])).items() if k in _SETTINGS_KEYS}).fallback_enabled()
