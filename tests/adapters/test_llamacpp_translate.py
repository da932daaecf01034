"""llama.cpp adapter on golden JSON, no model: wire -> GenRequest, events -> frames, infill."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from frink_mlx.adapters.llamacpp import fim_style, resolve_logit_bias, resolve_prompt, wire
from frink_mlx.adapters.llamacpp.translate import (
    BANNED_BIAS,
    CompletionBuilder,
    check_prompt,
    infill_prompt,
    split_prompts,
    to_gen_request,
)
from frink_mlx.core.events import Done, ErrorEvent, TextDelta, Usage
from frink_mlx.core.images import IMAGE_PLACEHOLDER, ImageRef
from frink_mlx.errors import InvalidRequest, UnsupportedField
from frink_mlx.http.body import decode_struct

FULL = {"prompt": "Once upon", "n_predict": 32, "temperature": 0.7, "top_k": 40, "top_p": 0.9,
        "min_p": 0.05, "repeat_penalty": 1.1, "repeat_last_n": 32, "seed": 7, "stop": ["\n"],
        "cache_prompt": False, "stream": True, "logit_bias": [[15, False], [16, 2.5]]}


def decode(body: dict[str, Any], kind: type = wire.CompletionRequest) -> Any:
    return decode_struct(json.dumps(body).encode(), kind)


def test_every_field_translates() -> None:
    body = decode(FULL)
    gen = to_gen_request(body, body.prompt)
    s = gen.sampling
    assert (gen.prompt, gen.max_tokens, gen.stop, gen.stream, gen.cache_prompt) == (
        "Once upon", 32, ["\n"], True, False)
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty) == (
        0.7, 40, 0.9, 0.05, 1.1)
    assert (s.penalty_context_size, s.seed, s.logit_bias) == (32, 7, {15: BANNED_BIAS, 16: 2.5})
    assert gen.sampling_sent == {"temperature", "top_k", "top_p", "min_p", "repetition_penalty"}
    assert gen.messages is None and gen.model == "default"


def test_defaults_and_unbounded_n_predict() -> None:
    body = decode({"prompt": "x", "seed": -1, "grammar": "root ::= \"a\""})
    gen = to_gen_request(body, "x")
    assert gen.max_tokens is None and gen.sampling.seed is None and gen.cache_prompt is True
    assert gen.sampling_sent == frozenset()
    assert gen.response_format is not None and gen.response_format.kind == "grammar"
    assert gen.response_format.param == "grammar"


@pytest.mark.parametrize("patch,param", [
    ({"mirostat": 2}, "mirostat"), ({"typical_p": 0.5}, "typical_p"),
    ({"post_sampling_probs": True}, "post_sampling_probs")])
def test_refusals_by_name(patch: dict, param: str) -> None:
    with pytest.raises(UnsupportedField) as err:
        to_gen_request(decode({"prompt": "x", **patch}), "x")
    assert err.value.param == param


def test_a_logit_bias_key_that_is_no_token_is_400() -> None:
    with pytest.raises(InvalidRequest) as err:   # texts are tokenized by the route first
        to_gen_request(decode({"prompt": "x", "logit_bias": [[1.5, 1.0]]}), "x")
    assert err.value.param == "logit_bias[0]"


def test_time_budget_is_passed_on_when_positive() -> None:
    """Rule 11: llama.vim's t_max_predict_ms bounds the completion; 0 or less is no budget."""
    assert to_gen_request(decode({"prompt": "x", "t_max_predict_ms": 1000}), "x"
                          ).max_predict_ms == 1000
    for off in (0, -1, None):
        assert to_gen_request(decode({"prompt": "x", "t_max_predict_ms": off}), "x"
                              ).max_predict_ms is None


def test_plugin_fields_are_accepted() -> None:
    """llama.vim's FIM request (issue 23): n_probs honoured, the rest accepted."""
    body = decode({"prompt": "x", "n_probs": 3, "id_slot": 2, "n_indent": 4, "samplers": ["top_k"],
                   "t_max_prompt_ms": 500, "t_max_predict_ms": 1000, "cache_prompt": True,
                   "response_fields": ["content", "timings/prompt_n"], "n_predict": 0})
    gen = to_gen_request(body, "x")
    assert gen.sampling.logprobs and gen.sampling.top_logprobs == 3
    assert gen.max_tokens == 1  # a warm-up: one step, its token discarded


def test_prompt_shapes() -> None:
    check_prompt("x")
    check_prompt([1, 2, "x"])
    with pytest.raises(InvalidRequest):
        check_prompt("")
    with pytest.raises(InvalidRequest):
        check_prompt([])


@pytest.mark.parametrize("prompt, prompts", [
    ("x", ["x"]), ([1, 2, "x"], [[1, 2, "x"]]), ([1, 2], [[1, 2]]), (["only one"], ["only one"]),
    (["a", "b"], ["a", "b"]), (["a", [1, 2]], ["a", [1, 2]]),
    ([[1, "x"], [3]], [[1, "x"], [3]]), ([[1, 2]], [[1, 2]])])
def test_several_prompts_are_split_as_llama_server_does(prompt: Any, prompts: list) -> None:
    """Rule 9: strings only, or lists inside, are several prompts; ids with text are one."""
    assert split_prompts(prompt, stream=False) == [(p, []) for p in prompts]


def test_json_prompt_objects_are_their_text_and_their_media_image_parts() -> None:
    """Rule 10."""
    text = wire.PromptObject("hello")
    assert split_prompts(text, stream=False) == [("hello", [])]
    assert split_prompts([[1, 2], text], stream=False) == [([1, 2], []), ("hello", [])]
    ((one, refs),) = split_prompts(wire.PromptObject("x <__media__> y <__media__>",
                                                     ["iVBOR", "data:image/png;base64,AAAA"]),
                                   stream=False)
    assert one == f"x {IMAGE_PLACEHOLDER} y {IMAGE_PLACEHOLDER}"
    assert refs == [ImageRef("prompt.multimodal_data[0]", data="iVBOR"),
                    ImageRef("prompt.multimodal_data[1]", data="AAAA", media_type="image/png")]
    (_, (two, refs)) = split_prompts(["a", wire.PromptObject("<__media__>", ["QUJD"])],
                                     stream=False)
    assert two == IMAGE_PLACEHOLDER and refs[0].path == "prompt[1].multimodal_data[0]"
    for bad, param in [(wire.PromptObject("x <__media__>", []), "prompt.multimodal_data"),
                       (wire.PromptObject("x", ["QUJD"]), "prompt.multimodal_data"),
                       (wire.PromptObject("<__media__>", [7]), "prompt.multimodal_data[0]")]:
        with pytest.raises(InvalidRequest) as err:
            split_prompts(bad, stream=False)
        assert err.value.param == param


def test_several_prompts_refuse_stream_and_stray_ids() -> None:
    with pytest.raises(UnsupportedField) as err:
        split_prompts(["a", "b"], stream=True)
    assert err.value.param == "prompt"
    with pytest.raises(InvalidRequest):
        split_prompts([[1, 2], 3], stream=False)
    with pytest.raises(InvalidRequest) as err:
        to_gen_request(decode({"prompt": "x", "n_predict": -2}), "x")
    assert err.value.param == "n_predict"


class FakeState:
    """tokenize/token_pieces over a tiny vocabulary where listed markers are one token."""

    def __init__(self, specials: list[str]) -> None:
        self.specials = {s: 1000 + i for i, s in enumerate(specials)}
        self.calls = 0   # tokenize and tokenize_many calls: leases and hops

    async def tokenize(self, model: Any, text: str, *, add_special: bool) -> list[int]:
        return (await self.tokenize_many(model, [text], add_special=add_special))[0]

    async def tokenize_many(self, model: Any, texts: list[str], *, add_special: bool
                            ) -> list[list[int]]:
        self.calls += 1
        return [([1] if add_special else [])
                + ([self.specials[t]] if t in self.specials else [ord(c) for c in t])
                for t in texts]

    async def token_pieces(self, model: Any, ids: list[int]) -> list[str]:
        inverse = {v: k for k, v in self.specials.items()}
        return [inverse.get(i, chr(i)) for i in ids]


def test_mixed_prompt_resolution() -> None:
    state = FakeState([])
    got = asyncio.run(resolve_prompt(state, None, ["ab", 5, "c"]))
    assert got == [1, ord("a"), ord("b"), 5, ord("c")]
    assert asyncio.run(resolve_prompt(state, None, [5, "c"])) == [5, ord("c")]
    assert asyncio.run(resolve_prompt(state, None, ["solo"])) == "solo"


def test_many_texts_are_tokenized_in_one_job() -> None:
    """A mixed prompt of 600 pieces and 1023 text logit_bias keys (and an id): a lease and a hop per
    piece held the loop for a second (benchmarks/results/hostile-2026-12-04.txt)."""
    state = FakeState([])
    mixed: list[int | str] = [p for i in range(300) for p in (f"w{i}", 5)]
    got = asyncio.run(resolve_prompt(state, None, mixed))
    assert got[:4] == [1, ord("w"), ord("0"), 5] and got[-4:] == [ord("2"), ord("9"), ord("9"), 5]
    assert state.calls == 2   # the leading piece with BOS, then all the others
    state.calls = 0
    bias = asyncio.run(resolve_logit_bias(state, None, [[f"w{i}", -1] for i in range(1023)]
                                          + [[7, 2]]))
    assert bias is not None and bias[:2] == [[ord("w"), -1], [ord("0"), -1]]
    assert bias[-1] == [7, 2] and state.calls == 1


def test_fim_detection_and_prompt() -> None:
    assert asyncio.run(fim_style(FakeState([]), None)) is None
    qwen = FakeState(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"])
    style = asyncio.run(fim_style(qwen, None))
    assert style == ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>")
    body = decode({"input_prefix": "def f(", "input_suffix": "):\n", "prompt": "a",
                   "input_extra": [{"filename": "u.py", "text": "X = 1\n"}]}, wire.InfillRequest)
    assert infill_prompt(body, style) == ("<|file_sep|>u.py\nX = 1\n<|file_sep|>filename\n"
                                          "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>a")
    star = FakeState(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    star_style = asyncio.run(fim_style(star, None))
    assert star_style == ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", None)
    with pytest.raises(UnsupportedField) as err:
        infill_prompt(body, star_style)
    assert err.value.param == "input_extra"


DONE = Done("stop", Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=8),
            stop_kind="stop_sequence", stop_sequence="\n",
            timings={"prompt_ms": 20.0, "predicted_ms": 40.0})


def test_frames_golden() -> None:
    ids: list[int] = []
    builder = CompletionBuilder("tiny", prompt="Once upon", prompt_tokens=10,
                                settings={"n_predict": 4}, return_tokens=True,
                                output_ids=lambda: ids)
    frames = []
    for step, event in ((1, TextDelta("a")), (0, TextDelta("")), (2, TextDelta(" time")),
                        (1, DONE)):
        ids.extend(range(len(ids), len(ids) + step))
        frames += builder.feed(event)
    assert frames[:2] == [
        {"content": "a", "tokens": [0], "stop": False, "id_slot": 0, "index": 0,
         "tokens_predicted": 1, "tokens_evaluated": 10},
        {"content": " time", "tokens": [1, 2], "stop": False, "id_slot": 0, "index": 0,
         "tokens_predicted": 3, "tokens_evaluated": 10}]
    final = frames[2]
    # the decode rates cover the 3 tokens after the first (which came out of the prefill)
    assert final == {
        "content": "", "tokens": [3], "stop": True, "model": "tiny", "id_slot": 0, "index": 0,
        "stop_type": "word", "stopping_word": "\n", "tokens_predicted": 4, "tokens_evaluated": 10,
        "tokens_cached": 8, "truncated": False, "has_new_line": False, "prompt": "Once upon",
        "generation_settings": {"n_predict": 4},
        "timings": {"cache_n": 8, "prompt_n": 2, "prompt_ms": 20.0, "prompt_per_token_ms": 10.0,
                    "prompt_per_second": 100.0, "predicted_n": 4, "predicted_ms": 40.0,
                    "predicted_per_token_ms": 40.0 / 3, "predicted_per_second": 75.0}}
    result = builder.result()
    assert result["content"] == "a time" and result["stop_type"] == "word"
    assert result["tokens"] == [0, 1, 2, 3]
    assert builder.result(["content", "timings/prompt_n", "timings/nope", ""]) == {
        "content": "a time", "timings/prompt_n": 2}


def test_one_token_reports_no_decode_rate_and_warmups_no_content() -> None:
    done = Done("length", Usage(prompt_tokens=10, completion_tokens=1),
                stop_kind="length", timings={"prompt_ms": 20.0, "predicted_ms": 0.01})
    builder = CompletionBuilder("tiny")
    builder.feed(done)
    assert builder.result()["timings"]["predicted_per_second"] == 0.0
    warm = CompletionBuilder("tiny", warmup=True)
    assert warm.feed(TextDelta("x")) == []
    warm.feed(done)
    result = warm.result()
    assert result["content"] == "" and result["tokens_predicted"] == 0
    assert warm.result([""]) == {}


@pytest.mark.parametrize("kind,expected", [("eos", "eos"), ("length", "limit"), ("abort", "none")])
def test_stop_types(kind: str, expected: str) -> None:
    builder = CompletionBuilder("tiny")
    builder.feed(Done("stop", Usage(), stop_kind=kind))  # type: ignore[arg-type]
    assert builder.result()["stop_type"] == expected and builder.result()["stopping_word"] == ""


def test_error_frame() -> None:
    assert CompletionBuilder("tiny").feed(ErrorEvent("boom", status=500)) == [
        {"error": {"code": 500, "message": "boom", "type": "server_error"}}]
