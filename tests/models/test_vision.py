"""models/vision.py + serving/vision.py on the paged engine: mlx-vlm's greedy ids, exactly.

Tiny random Gemma 3 and Qwen2.5-VL VLMs (tests/vision_support.py) run through
frink's scheduler and runner -- chunked prefill that cuts through an image's
token run, batched beside text-only rows, two images in one prompt, n=2 -- and
every row's greedy ids equal mlx-vlm's own `generate` for the same images and
prompt. Qwen's rows carry M-RoPE positions (models/vision.py rule 6), so a
batch mixes rows whose positions are their indices with rows whose are not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx_vlm")
pytest.importorskip("PIL")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from test_runner_parity import drive  # noqa: E402
from vision_support import (  # noqa: E402
    make_tiny_gemma3_vlm,
    make_tiny_qwen2_5_vl,
    mlx_vlm_greedy,
    png_base64,
    png_image,
)

from frink_mlx.config import ImageLimits  # noqa: E402
from frink_mlx.core.images import IMAGE_PLACEHOLDER, ImageRef  # noqa: E402
from frink_mlx.core.request import GenRequest, Message, SamplingParams  # noqa: E402
from frink_mlx.engine.types import SeqRequest  # noqa: E402
from frink_mlx.models.vision import load_vision  # noqa: E402
from frink_mlx.serving.vision import render_vision  # noqa: E402

LIMITS = ImageLimits(max_images=8, max_image_bytes=1 << 20, max_image_pixels=1 << 20)
GREEDY = SamplingParams(temperature=0)
N_OUT = 8


@pytest.fixture(scope="module")
def vlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple]:
    path = make_tiny_gemma3_vlm(tmp_path_factory.mktemp("gemma3-vlm"))
    return path, load_vision(path, "tiny-vlm")


def _request(text: str, seeds: list[int]) -> GenRequest:
    refs = [ImageRef(f"messages[0].content[{k}]", data=png_base64(s)) for k, s in enumerate(seeds)]
    content = "".join(IMAGE_PLACEHOLDER for _ in seeds) + text
    return GenRequest(model="m", messages=[Message("user", content, images=refs)], images=refs)


def _reference(path: Path, text: str, seeds: list[int]) -> list[int]:
    parts = [{"type": "image"} for _ in seeds] + [{"type": "text", "text": text}]
    return mlx_vlm_greedy(path, [{"role": "user", "content": parts}],
                          [png_image(s) for s in seeds], N_OUT)


def _seq(vlm: tuple, rid: str, text: str, seeds: list[int], n: int = 1) -> SeqRequest:
    _, (model, vision, tokenizer, _) = vlm
    rendered, images, keys = render_vision(vision, tokenizer, _request(text, seeds), None, LIMITS)
    return SeqRequest(rid, rendered.ids, GREEDY, N_OUT, n=n, images=images, key_ids=keys)


def test_greedy_ids_equal_mlx_vlm_alone_and_batched_with_text(vlm: tuple) -> None:
    path, (model, _, tokenizer, _) = vlm
    one = _seq(vlm, "one", "describe the image please", [0])
    two = _seq(vlm, "two", "and the second one?", [1, 2])
    text_ids = tokenizer.encode("<bos>hello world", add_special_tokens=False)
    text = SeqRequest("text", text_ids, GREEDY, N_OUT)
    alone = drive(model, {0: [SeqRequest("text", text_ids, GREEDY, N_OUT)]})["text"][0]
    want_one = _reference(path, "describe the image please", [0])
    assert drive(model, {0: [_seq(vlm, "one", "describe the image please", [0])]},
                 chunk=64)["one"][0] == want_one
    outs = drive(model, {0: [one, text], 1: [two]}, chunk=5)   # chunks cut the image runs
    assert outs["one"][0] == want_one
    assert outs["two"][0] == _reference(path, "and the second one?", [1, 2])
    assert outs["text"][0] == alone


def test_n2_rows_share_the_image_prompt(vlm: tuple) -> None:
    path, (model, *_rest) = vlm
    outs = drive(model, {0: [_seq(vlm, "pair", "describe the image please", [3], n=2)]})
    want = _reference(path, "describe the image please", [3])
    assert outs["pair"][0] == want and outs["pair"][1] == want


def test_key_ids_tell_images_apart_and_keep_text(vlm: tuple) -> None:
    a = _seq(vlm, "a", "describe the image please", [0])
    b = _seq(vlm, "b", "describe the image please", [1])
    again = _seq(vlm, "c", "describe the image please", [0])
    assert a.prompt_ids == b.prompt_ids            # the same image token ids ...
    assert a.key_ids != b.key_ids                  # ... keyed apart by their images
    assert a.key_ids == again.key_ids
    assert a.images is not None and a.key_ids is not None
    text = [i for i in range(len(a.prompt_ids)) if i not in set(a.images.positions)]
    assert all(a.key_ids[i] == a.prompt_ids[i] for i in text)
    assert all(a.key_ids[i] < 0 for i in a.images.positions)


# --- Qwen2.5-VL: M-RoPE positions on the paged engine (models/vision.py rule 6) ---

WIDE = (64, 32)   # a 10-token image (2 x 5 merged patches) beside the 9-token square one


@pytest.fixture(scope="module")
def qvlm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple]:
    path = make_tiny_qwen2_5_vl(tmp_path_factory.mktemp("qwen2_5_vl"))
    return path, load_vision(path, "tiny-qwen-vl")


def _qwen_request(text: str, images: list[tuple[int, tuple[int, int]]]) -> GenRequest:
    refs = [ImageRef(f"messages[0].content[{k}]", data=png_base64(seed, size))
            for k, (seed, size) in enumerate(images)]
    content = "".join(IMAGE_PLACEHOLDER for _ in images) + text
    return GenRequest(model="m", messages=[Message("user", content, images=refs)], images=refs)


def _qwen_seq(qvlm: tuple, rid: str, text: str, images: list[tuple[int, tuple[int, int]]],
              n: int = 1) -> SeqRequest:
    _, (_, vision, tokenizer, _) = qvlm
    rendered, inputs, keys = render_vision(vision, tokenizer, _qwen_request(text, images),
                                           None, LIMITS)
    return SeqRequest(rid, rendered.ids, GREEDY, N_OUT, n=n, images=inputs, key_ids=keys)


def _qwen_reference(path: Path, text: str, images: list[tuple[int, tuple[int, int]]]) -> list[int]:
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
    return mlx_vlm_greedy(path, [{"role": "user", "content": parts}],
                          [png_image(seed, size) for seed, size in images], N_OUT)


def test_qwen_image_positions_are_its_grid_not_its_indices(qvlm: tuple) -> None:
    seq = _qwen_seq(qvlm, "q", "describe the image please", [(0, (50, 40)), (1, WIDE)])
    assert seq.images is not None
    num = len(seq.prompt_ids)
    table = seq.images.rope_positions(0, num)
    first, second = seq.images.positions[0], seq.images.positions[9]
    assert table[:, first].tolist() == [first] * 3           # the grid's corner ...
    assert table[1:, first + 4].tolist() == [first + 1] * 2  # ... 3 x 3: (row 1, col 1)
    assert table[:, second].tolist() == [second - 6] * 3     # 9 tokens took 3 positions
    after = seq.images.rope_positions(num, 2)                 # generated tokens: index + delta
    assert after.tolist() == [[table[0, -1] + 1, table[0, -1] + 2]] * 3
    assert table[0, -1] + 1 < num


def test_qwen_greedy_ids_equal_mlx_vlm_alone_batched_and_chunked(qvlm: tuple) -> None:
    path, (model, _, tokenizer, _) = qvlm
    square, wide = [(0, (50, 40))], [(1, (50, 40)), (2, WIDE)]
    want_one = _qwen_reference(path, "describe the image please", square)
    want_two = _qwen_reference(path, "and the second one?", wide)
    alone = drive(model, {0: [_qwen_seq(qvlm, "one", "describe the image please", square)]},
                  chunk=64)
    assert alone["one"][0] == want_one
    text_ids = tokenizer.encode("hello world", add_special_tokens=False)
    text_alone = drive(model, {0: [SeqRequest("text", text_ids, GREEDY, N_OUT)]})["text"][0]
    outs = drive(model, {0: [_qwen_seq(qvlm, "one", "describe the image please", square),
                             SeqRequest("text", text_ids, GREEDY, N_OUT)],
                         2: [_qwen_seq(qvlm, "two", "and the second one?", wide)]},
                 chunk=5)   # chunks cut both images' runs; decode rows of both kinds batch
    assert outs["one"][0] == want_one
    assert outs["two"][0] == want_two
    assert outs["text"][0] == text_alone


def test_qwen_n2_rows_share_the_image_prompt(qvlm: tuple) -> None:
    path, (model, *_rest) = qvlm
    outs = drive(model, {0: [_qwen_seq(qvlm, "pair", "describe the image please",
                                       [(3, WIDE)], n=2)]})
    want = _qwen_reference(path, "describe the image please", [(3, WIDE)])
    assert outs["pair"][0] == want and outs["pair"][1] == want


# --- models/vision.py rule 4: images a prefix-cache hit covers are not encoded ---

@pytest.mark.parametrize("family", ["gemma3", "qwen"])
def test_rows_encode_only_the_images_past_the_cached_prefix(
        vlm: tuple, qvlm: tuple, family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx.core as mx

    from frink_mlx.models.vision import ImageFeatures

    if family == "gemma3":
        seq = _seq(vlm, "s", "and the second one?", [1, 2])
    else:
        seq = _qwen_seq(qvlm, "s", "and the second one?", [(1, (50, 40)), (2, WIDE)])
    images = seq.images
    assert isinstance(images, ImageFeatures)
    calls: list[int] = []
    tower = type(images.vision.vlm.vision_tower)
    original = tower.__call__

    def counting(self: object, pixels: mx.array, *args: object, **kwargs: object) -> object:
        grid = args[0] if args else kwargs.get("grid_thw")
        calls.append(int(grid.shape[0] if grid is not None else pixels.shape[0]))  # type: ignore[attr-defined]
        return original(self, pixels, *args, **kwargs)

    monkeypatch.setattr(tower, "__call__", counting)
    num = len(images.positions)
    first_len = images.prompt.spans[0][1]
    whole = ImageFeatures(images.vision, images.prompt).rows(0, num)
    assert calls == [2]
    later = ImageFeatures(images.vision, images.prompt)
    tail = later.rows(first_len, num)                   # the hit covers image 1: image 2 alone
    assert calls == [2, 1]
    # One image through the tower is the same encoding as two, up to float rounding: with
    # OpenBLAS a batch of another shape blocks its GEMMs differently (last-bit differences).
    assert mx.allclose(tail, whole[first_len:], rtol=1e-5, atol=1e-5).item()
    assert later.rows(first_len + 1, num).shape[0] == num - first_len - 1 and calls == [2, 1]
    assert mx.allclose(later.rows(1, num), whole[1:], rtol=1e-5, atol=1e-5).item()  # image 1 again
    assert calls == [2, 1, 2]
