"""Images over HTTP on vision models (Gemma 3; Qwen2.5-VL's M-RoPE): every protocol reads them,
the prefix cache keys them, bad images are 400s naming the part (serving/vision.py)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("mlx_vlm")
pytest.importorskip("PIL")

from vision_support import mlx_vlm_greedy, png_base64, png_image  # noqa: E402

PROMPT = "describe the image please"


def post(live: Any, path: str, **body: Any) -> httpx.Response:
    return httpx.post(live.url + path, json=body, timeout=120)


def data_url(seed: int = 0) -> str:
    return "data:image/png;base64," + png_base64(seed)


def chat(live: Any, content: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return post(live, "/v1/chat/completions", model="vlm", max_tokens=8, temperature=0,
                messages=[{"role": "user", "content": content}], **extra)


def _reference_text(live: Any, seed: int) -> str:
    from mlx_lm.utils import load_tokenizer

    ids = mlx_vlm_greedy(Path(live.vlm_path), [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": PROMPT}]}], [png_image(seed)], 8)
    ids = [i for i in ids if i not in (2, 4)]
    return load_tokenizer(Path(live.vlm_path)).decode(ids)


def test_openai_chat_reads_the_image_as_mlx_vlm_does(vlive: Any) -> None:
    r = chat(vlive, [{"type": "image_url", "image_url": {"url": data_url(0)}},
                     {"type": "text", "text": PROMPT}])
    assert r.status_code == 200, r.text
    assert "x-frink-images-omitted" not in r.headers
    assert r.json()["choices"][0]["message"]["content"] == _reference_text(vlive, 0)


def test_every_protocol_takes_images(vlive: Any) -> None:
    b64 = png_base64(1)
    answers = [
        post(vlive, "/v1/messages", model="vlm", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "read it"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                               "input": {"file_path": "a.png"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": b64}}]}]}]),
        post(vlive, "/v1/responses", model="vlm", max_output_tokens=4, input=[
            {"role": "user", "content": [{"type": "input_text", "text": PROMPT},
                                         {"type": "input_image", "image_url": data_url(1)}]}]),
        post(vlive, "/api/chat", model="vlm", stream=False, options={"num_predict": 4},
             messages=[{"role": "user", "content": PROMPT, "images": [b64]}]),
        post(vlive, "/api/generate", model="vlm", stream=False, prompt=PROMPT, images=[b64],
             options={"num_predict": 4}),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
        assert "x-frink-images-omitted" not in r.headers


def test_turn_two_hits_the_cache_over_the_image_and_another_image_misses(vlive: Any) -> None:
    first = [{"type": "image_url", "image_url": {"url": data_url(2)}},
             {"type": "text", "text": PROMPT}]
    r1 = chat(vlive, first)
    assert r1.status_code == 200, r1.text
    answer = r1.json()["choices"][0]["message"]["content"]

    def turn_two(content: list[dict[str, Any]]) -> dict[str, Any]:
        r = post(vlive, "/v1/chat/completions", model="vlm", max_tokens=4, temperature=0,
                 messages=[{"role": "user", "content": content},
                           {"role": "assistant", "content": answer},
                           {"role": "user", "content": "and the second one?"}])
        assert r.status_code == 200, r.text
        return r.json()["usage"]

    same = turn_two(first)
    # the image's 4 tokens stand at 8..11: <bos> <start_of_turn> user \n \n\n <start_of_image>
    image_start, image_end = 8, 12
    assert same["prompt_tokens_details"]["cached_tokens"] >= image_end
    other = turn_two([{"type": "image_url", "image_url": {"url": data_url(3)}},
                      {"type": "text", "text": PROMPT}])
    assert other["prompt_tokens_details"]["cached_tokens"] <= image_start


def test_qwen_turn_two_hits_the_cache_over_the_image_and_reads_as_mlx_vlm(vlive: Any) -> None:
    """M-RoPE (models/vision.py rule 6): turn 2's uncached tail sits at index + rope_delta."""
    from mlx_lm.utils import load_tokenizer

    path = Path(vlive.qvlm_path)
    tokenizer = load_tokenizer(path)

    def reference(messages: list[dict[str, Any]]) -> str:
        ids = mlx_vlm_greedy(path, messages, [png_image(5)], 8)
        return tokenizer.decode([i for i in ids if i not in tokenizer.eos_token_ids])

    def ask(messages: list[dict[str, Any]]) -> httpx.Response:
        r = post(vlive, "/v1/chat/completions", model="qvlm", max_tokens=8, temperature=0,
                 messages=messages)
        assert r.status_code == 200, r.text
        return r

    first = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(5)}},
                                          {"type": "text", "text": PROMPT}]}]
    answer = ask(first).json()["choices"][0]["message"]["content"]
    assert answer == reference([{"role": "user", "content": [{"type": "image"},
                                                             {"type": "text", "text": PROMPT}]}])
    follow = [{"role": "assistant", "content": answer},
              {"role": "user", "content": "and the second one?"}]
    r2 = ask(first + follow).json()
    # <|im_start|> user \n <|vision_start|> at 0..4, then the image's 9 tokens at 5..13
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] >= 14
    assert r2["choices"][0]["message"]["content"] == reference(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]},
         *follow])


def _png_bytes(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _bad_images() -> list[tuple[str, str]]:
    from PIL import Image

    whole = base64.b64decode(png_base64(4))
    svg = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>')
    return [
        ("truncated", "data:image/png;base64," + base64.b64encode(whole[:len(whole) // 2]).decode()),
        ("base64", "data:image/png;base64,@@not base64@@"),
        ("huge", "data:image/png;base64," + _png_bytes(Image.new("1", (20000, 20000)))),
        ("svg", "data:image/svg+xml;base64," + svg.decode()),
        ("pdf", "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4\n").decode()),
        ("remote", "https://example.com/cat.png"),
    ]


@pytest.mark.parametrize("kind,url", _bad_images(), ids=[k for k, _ in _bad_images()])
def test_bad_images_are_400s_naming_the_part(vlive: Any, kind: str, url: str) -> None:
    r = chat(vlive, [{"type": "text", "text": PROMPT}, {"type": "image_url", "image_url": {"url": url}}])
    assert r.status_code == 400, (kind, r.text)
    assert r.json()["error"]["param"] == "messages[0].content[1]"
    ok = chat(vlive, [{"type": "image_url", "image_url": {"url": data_url(0)}},
                      {"type": "text", "text": PROMPT}])
    assert ok.status_code == 200


def test_too_many_images_and_the_anthropic_envelope(vlive: Any) -> None:
    many = [{"type": "image_url", "image_url": {"url": data_url(0)}}] * 100
    r = chat(vlive, [*many, {"type": "text", "text": PROMPT}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[8]"
    r = post(vlive, "/v1/messages", model="vlm", max_tokens=4, messages=[
        {"role": "user", "content": [{"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "messages[0].content[0]" in r.json()["error"]["message"]


def test_a_text_only_model_beside_it_still_gets_the_placeholder(vlive: Any) -> None:
    r = post(vlive, "/v1/chat/completions", model="tiny", max_tokens=2, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(0)}}]}])
    assert r.status_code == 200 and r.headers["x-frink-images-omitted"] == "1"


# --- llama.cpp /completion: multimodal_data behind <__media__> markers (translate.py rule 10) ---

RAW = {"vlm": "<bos><start_of_turn>user\n<__media__>" + PROMPT +
       "<end_of_turn>\n<start_of_turn>model\n",
       "qvlm": "<|im_start|>user\n<__media__>" + PROMPT + "<|im_end|>\n<|im_start|>assistant\n"}


@pytest.mark.parametrize("model", ["vlm", "qvlm"])
def test_llamacpp_media_markers_read_as_the_chat_route_does(vlive: Any, model: str) -> None:
    props = httpx.get(vlive.url + "/props", params={"model": model}, timeout=30).json()
    assert props["modalities"]["vision"] is True and props["media_marker"] == "<__media__>"
    r = post(vlive, "/completion", model=model, n_predict=8, temperature=0, prompt={
        "prompt_string": RAW[model], "multimodal_data": [png_base64(6)]})
    assert r.status_code == 200, r.text
    assert "x-frink-images-omitted" not in r.headers
    chat = post(vlive, "/v1/chat/completions", model=model, max_tokens=8, temperature=0,
                messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": data_url(6)}},
                    {"type": "text", "text": PROMPT}]}])
    assert r.json()["content"] == chat.json()["choices"][0]["message"]["content"]
    assert r.json()["tokens_evaluated"] == chat.json()["usage"]["prompt_tokens"]


def test_llamacpp_media_on_a_text_only_model_and_bad_media(vlive: Any) -> None:
    assert httpx.get(vlive.url + "/props", params={"model": "tiny"},
                     timeout=30).json()["modalities"]["vision"] is False
    body = {"prompt_string": "look: <__media__> and say", "multimodal_data": [png_base64(0)]}
    r = post(vlive, "/completion", model="tiny", n_predict=2, prompt=body)
    assert r.status_code == 200 and r.headers["x-frink-images-omitted"] == "1"
    many = post(vlive, "/completion", model="vlm", n_predict=2, prompt={
        "prompt_string": "no marker", "multimodal_data": [png_base64(0)]})
    assert many.status_code == 400 and "prompt.multimodal_data" in many.json()["error"]["message"]
    bad = post(vlive, "/completion", model="vlm", n_predict=2, prompt=[
        "first", {"prompt_string": "<__media__>", "multimodal_data": ["@@not base64@@"]}])
    assert bad.status_code == 400
    assert "prompt[1].multimodal_data[0]" in bad.json()["error"]["message"]


def test_models_and_status_say_which_models_read_images(vlive: Any) -> None:
    """Known from the checkpoint before a load (serving/embeddings.py `describe`)."""
    listed = {m["id"]: m["vision"] for m in
              httpx.get(vlive.url + "/v1/models", timeout=30).json()["data"]}
    assert listed == {"vlm": True, "qvlm": True, "tiny": False}
    status = httpx.get(vlive.url + "/admin/status", timeout=30).json()
    assert {m["name"]: m["vision"] for m in status["models"]} == listed
    shown = {name: post(vlive, "/api/show", model=name).json()["capabilities"]
             for name in listed}
    assert {name: "vision" in caps for name, caps in shown.items()} == listed
