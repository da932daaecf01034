"""An image is encoded once per cached prefix, not once per turn (models/vision.py rule 4).

The vision tower's class is wrapped to count its calls and the images each call
encodes, on the live vision daemon (conftest.py `vlive`), over an agent-shaped
conversation: a screenshot, two more turns that resend it, a second screenshot,
one more turn. Every turn's prompt is the last one's plus the answer and a new
user message, so the prefix cache covers every image already sent, and the
tower must see each image exactly once.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

pytest.importorskip("mlx_vlm")
pytest.importorskip("PIL")

from vision_support import mlx_vlm_greedy, png_base64, png_image  # noqa: E402

LONG = "describe the image please, and what is in this picture? " * 2  # > a block after it
FIRST_IMAGE_END = {"vlm": 12, "qvlm": 14}   # test_vision_http.py: where the image's run ends


def _count_tower(monkeypatch: pytest.MonkeyPatch, live: Any, model: str) -> list[int]:
    """Per tower call, how many images it encoded (Gemma: pixel rows; Qwen: grid rows)."""
    resident = next(r for r in live.state.hub.residency.residents.values()
                    if r.gen.spec.name == model)
    tower = type(resident.gen.loaded.vision.vlm.vision_tower)
    calls: list[int] = []
    original = tower.__call__

    def counting(self: Any, pixels: Any, *args: Any, **kwargs: Any) -> Any:
        grid = args[0] if args else kwargs.get("grid_thw")
        calls.append(int(grid.shape[0] if grid is not None else pixels.shape[0]))
        return original(self, pixels, *args, **kwargs)

    monkeypatch.setattr(tower, "__call__", counting)
    return calls


def _image(seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png_base64(seed)}}


def _reference(live: Any, model: str, messages: list[dict[str, Any]], seeds: list[int]) -> str:
    """mlx-vlm's greedy answer to the same conversation, both images encoded together."""
    from pathlib import Path

    from mlx_lm.utils import load_tokenizer

    path = Path(live.vlm_path if model == "vlm" else live.qvlm_path)
    parts = [[{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]
             if isinstance(m["content"], list) else m["content"] for m in messages]
    ids = mlx_vlm_greedy(path, [{"role": m["role"], "content": c} for m, c in zip(messages, parts)],
                         [png_image(s) for s in seeds], 4)
    tokenizer = load_tokenizer(path)
    return str(tokenizer.decode([i for i in ids if i not in tokenizer.eos_token_ids]))


@pytest.mark.parametrize("model,seed", [("vlm", 40), ("qvlm", 50)])
def test_each_image_is_encoded_once_across_the_turns_that_resend_it(
        vlive: Any, monkeypatch: pytest.MonkeyPatch, model: str, seed: int) -> None:
    def turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
        r = httpx.post(vlive.url + "/v1/chat/completions", timeout=120, json={
            "model": model, "max_tokens": 4, "temperature": 0, "messages": messages})
        assert r.status_code == 200, r.text
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]
                         ["content"] or "ok"})
        return dict(r.json()["usage"])

    history: list[dict[str, Any]] = []
    turn(history + [{"role": "user", "content": "warm up"}])   # loads the model
    calls = _count_tower(monkeypatch, vlive, model)
    history.append({"role": "user", "content": [_image(seed), {"type": "text", "text": LONG}]})
    turn(history)
    assert calls == [1]
    for follow in ("and the second one?", "and again?"):
        history.append({"role": "user", "content": follow})
        usage = turn(history)
        assert usage["prompt_tokens_details"]["cached_tokens"] >= FIRST_IMAGE_END[model]
        assert calls == [1]                         # the hit covers the image: no encoding
    history.append({"role": "user", "content": [{"type": "text", "text": "now this one:"},
                                                _image(seed + 1), {"type": "text", "text": LONG}]})
    turn(history)
    assert calls == [1, 1]                          # the new screenshot alone, not both
    assert history[-1]["content"] == _reference(vlive, model, history[:-1], [seed, seed + 1])
    del calls[2:]                                   # mlx-vlm's own calls for the reference
    history.append({"role": "user", "content": "compare them"})
    turn(history)
    assert calls == [1, 1]
    other = [{"role": "user", "content": [_image(seed + 2), {"type": "text", "text": LONG}]}]
    turn(other)
    assert calls == [1, 1, 1]                       # another image misses, and is encoded
