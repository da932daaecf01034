"""http/sse.py and http/body.py in isolation (ASGI transport, no model)."""

from __future__ import annotations

import asyncio

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from frink_mlx.errors import InvalidRequest, PayloadTooLarge
from frink_mlx.http.body import decode_body, decode_struct
from frink_mlx.http.errors import endpoint, openai_error
from frink_mlx.http.sse import sse_frame, sse_response


class Item(msgspec.Struct):
    name: str
    count: int = 0
    tags: list[str] = []


def test_decode_struct_names_the_field():
    with pytest.raises(InvalidRequest) as info:
        decode_struct(b'{"name": "x", "count": "many"}', Item)
    assert info.value.param == "count"
    with pytest.raises(InvalidRequest) as info:
        decode_struct(b'{"name": "x", "tags": ["a", 2]}', Item)
    assert info.value.param == "tags[1]"
    with pytest.raises(InvalidRequest) as info:
        decode_struct(b"{oops", Item)
    assert info.value.param is None and "not valid JSON" in info.value.message


def make_app(closed: list[str]) -> Starlette:
    @endpoint(openai_error)
    async def echo(request: Request):
        item = await decode_body(request, Item)
        return JSONResponse({"name": item.name})

    async def slow(request: Request):
        async def frames():
            yield sse_frame('{"n": 1}')
            await asyncio.sleep(0.35)
            yield sse_frame('{"n": 2}')

        return sse_response(frames(), on_close=lambda: closed.append("closed"), keepalive_s=0.1)

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"]), Route("/slow", slow)])
    return app


def test_body_limit_and_keepalive_and_on_close():
    closed: list[str] = []
    app = make_app(closed)

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            ok = await client.post("/echo", json={"name": "a"})
            assert ok.json() == {"name": "a"}
            big = await client.post("/echo", content=b"x" * (9 * 1024 * 1024))
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
            r = await client.get("/slow")
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.text.startswith('data: {"n": 1}\n\n')
            assert ": keepalive\n\n" in r.text and r.text.endswith('data: {"n": 2}\n\n')

    asyncio.run(main())
    assert closed == ["closed"]
    assert PayloadTooLarge.status == 413


def test_a_client_gone_before_its_answer_is_499_not_an_error(caplog):
    """Found by llama.cpp's suite: /completion's ClientDisconnected used to log a 500."""
    import asyncio
    import logging

    from frink_mlx.http.errors import endpoint, llamacpp_error
    from frink_mlx.http.sse import ClientDisconnected

    @endpoint(llamacpp_error)
    async def gone(request):
        raise ClientDisconnected()

    with caplog.at_level(logging.ERROR, logger="frink_mlx.http"):
        response = asyncio.run(gone(None))
    assert response.status_code == 499 and not caplog.records
