"""adapters/openai/counting.py over HTTP: counts and rendered templates match what a
generation of the same body would prompt with, and nothing is generated."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

HI = [{"role": "user", "content": "hi there"}]


def post(live: Any, path: str, **body: Any) -> httpx.Response:
    return httpx.post(live.url + path, json=body, timeout=120)


@pytest.mark.parametrize("path", ["/v1/chat/completions/input_tokens",
                                  "/chat/completions/input_tokens"])
def test_chat_input_tokens_equal_the_prompt_tokens_of_a_generation(live: Any, path: str) -> None:
    counted = post(live, path, model="tiny", messages=HI, max_tokens=5, stream=True)
    assert counted.status_code == 200, counted.text
    assert counted.json()["object"] == "response.input_tokens"
    used = post(live, "/v1/chat/completions", model="tiny", messages=HI, max_tokens=1)
    assert counted.json()["input_tokens"] == used.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("path", ["/v1/responses/input_tokens", "/responses/input_tokens"])
def test_responses_input_tokens_equal_the_input_tokens_of_a_response(live: Any, path: str) -> None:
    body = {"model": "tiny", "input": "hi there", "instructions": "Be brief."}
    counted = post(live, path, **body)
    assert counted.status_code == 200, counted.text
    used = post(live, "/v1/responses", **body, max_output_tokens=1)
    assert counted.json()["input_tokens"] == used.json()["usage"]["input_tokens"]


def test_counts_refuse_what_the_route_refuses(live: Any) -> None:
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "x"}}]}]
    r = post(live, "/v1/chat/completions/input_tokens", model="tiny", messages=audio)
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("messages[0]")


def test_an_image_part_counts_as_its_placeholder_as_the_route_serves_it(live: Any) -> None:
    """core/images.py: on a text-only model an image part becomes a placeholder text."""
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "x"}}]}]
    counted = post(live, "/v1/chat/completions/input_tokens", model="tiny", messages=image)
    assert counted.status_code == 200, counted.text
    r = post(live, "/v1/chat/completions", model="tiny", messages=image, max_tokens=1)
    assert r.status_code == 200 and r.headers["x-frink-images-omitted"] == "1"
    assert r.json()["usage"]["prompt_tokens"] == counted.json()["input_tokens"]


def test_a_codex_session_with_an_input_image_goes_on_answering(live: Any) -> None:
    """`codex exec -i shot.png`, then `codex exec resume` replaying it: every turn a 200."""
    shot = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "what is in the screenshot?"}, shot]}]
    for turn in range(3):
        r = post(live, "/v1/responses", model="tiny", input=history, max_output_tokens=3,
                 store=False)
        assert r.status_code == 200, r.text
        assert r.headers["x-frink-images-omitted"] == "1"
        said = [item for item in r.json()["output"] if item["type"] == "message"]
        history += [*said,
                    {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": f"and now? {turn}"}]}]


def test_apply_template_renders_what_the_model_is_prompted_with(live: Any) -> None:
    r = post(live, "/apply-template", model="tiny", messages=HI)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert "hi there" in prompt
    ids = post(live, "/tokenize", model="tiny", content=prompt, add_special=False).json()["tokens"]
    used = post(live, "/v1/chat/completions", model="tiny", messages=HI, max_tokens=1)
    assert abs(len(ids) - used.json()["usage"]["prompt_tokens"]) <= 1   # BOS, if any
    prefill = [*HI, {"role": "assistant", "content": "Hel"}]
    r = post(live, "/apply-template", model="tiny", messages=prefill, continue_final_message=True)
    assert r.json()["prompt"].endswith("Hel")
