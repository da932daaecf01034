"""core/checks.py: the one range check of sampling knobs and n, naming the client's field."""

from __future__ import annotations

import math

import pytest

from frink_mlx.core.checks import (
    MAX_LOGIT_BIAS,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOOLS,
    check_batch,
    check_request,
    check_sampling,
    token_id_of,
)
from frink_mlx.core.request import GenRequest, SamplingParams, Tool
from frink_mlx.errors import InvalidRequest

BAD = [
    ("temperature", -0.1), ("temperature", math.inf), ("temperature", math.nan),
    ("temperature", 1e-30), ("temperature", 1e6),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan),
    ("top_k", -1),
    ("min_p", 2.0), ("min_p", -0.1),
    ("presence_penalty", 3.0), ("frequency_penalty", -math.inf),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", 1e308),
    ("penalty_context_size", -2),
    ("top_logprobs", 21), ("top_logprobs", -1),
]


@pytest.mark.parametrize("name,value", BAD)
def test_out_of_range_knob_is_refused_by_its_name(name: str, value: float) -> None:
    with pytest.raises(InvalidRequest) as err:
        check_sampling(SamplingParams(**{name: value}))
    assert err.value.param == name and name in err.value.message


def test_defaults_and_edges_pass() -> None:
    check_sampling(SamplingParams())
    check_sampling(SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=1.0,
                                  presence_penalty=-2.0, frequency_penalty=2.0,
                                  repetition_penalty=10.0, top_logprobs=20,
                                  logit_bias={5: -1e9, 6: 100.0}))


@pytest.mark.parametrize("bias", [math.inf, -math.inf, math.nan, 1e10])
def test_logit_bias_must_be_finite_and_bounded(bias: float) -> None:
    with pytest.raises(InvalidRequest) as err:
        check_sampling(SamplingParams(logit_bias={7: bias}))
    assert err.value.param == "logit_bias" and "token 7" in err.value.message


def test_protocol_names_are_reported() -> None:
    req = GenRequest(model="m", prompt="hi", sampling=SamplingParams(repetition_penalty=1e308),
                     param_names={"repetition_penalty": "repeat_penalty"})
    with pytest.raises(InvalidRequest) as err:
        check_request(req, max_n=4)
    assert err.value.param == "repeat_penalty" and "'repeat_penalty'" in err.value.message


@pytest.mark.parametrize("n", [0, -1, 5, 2**31])
def test_n_is_bounded_by_max_n(n: int) -> None:
    with pytest.raises(InvalidRequest) as err:
        check_request(GenRequest(model="m", prompt="hi", n=n), max_n=4)
    assert err.value.param == "n" and "between 1 and 4" in err.value.message
    check_request(GenRequest(model="m", prompt="hi", n=4), max_n=4)


def test_max_tokens_below_one_is_refused_by_the_protocol_name() -> None:
    req = GenRequest(model="m", prompt="hi", max_tokens=0, param_names={"max_tokens": "n_predict"})
    with pytest.raises(InvalidRequest) as err:
        check_request(req, max_n=4)
    assert err.value.param == "n_predict"


@pytest.mark.parametrize("wire", ["stop", "stop_sequences", "options.stop"])
def test_stop_strings_are_bounded_in_count_and_length_by_the_protocols_name(wire: str) -> None:
    names = {"stop": wire}
    many = GenRequest(model="m", prompt="hi", stop=["x"] * (MAX_STOP_SEQUENCES + 1),
                      param_names=names)
    with pytest.raises(InvalidRequest) as err:
        check_request(many, max_n=4)
    assert err.value.param == wire and f"at most {MAX_STOP_SEQUENCES}" in err.value.message
    long = GenRequest(model="m", prompt="hi", stop=["ok", "y" * (MAX_STOP_CHARS + 1)],
                      param_names=names)
    with pytest.raises(InvalidRequest) as err:
        check_request(long, max_n=4)
    assert err.value.param == wire and f"'{wire}[1]'" in err.value.message
    assert len(err.value.message) < 200   # the value itself is never echoed
    check_request(GenRequest(model="m", prompt="hi", stop=["y" * MAX_STOP_CHARS] *
                             MAX_STOP_SEQUENCES), max_n=4)


def test_logit_bias_entries_and_tools_are_bounded() -> None:
    bias = {i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)}
    with pytest.raises(InvalidRequest) as err:
        check_request(GenRequest(model="m", prompt="hi", sampling=SamplingParams(logit_bias=bias)),
                      max_n=4)
    assert err.value.param == "logit_bias"
    tools = [Tool(f"f{i}") for i in range(MAX_TOOLS + 1)]
    with pytest.raises(InvalidRequest) as err:
        check_request(GenRequest(model="m", prompt="hi", tools=tools), max_n=4)
    assert err.value.param == "tools"


def test_a_batch_is_bounded_by_prompts_times_n() -> None:
    check_batch(4, 4, max_n=16)
    check_batch(1, 16, max_n=16)   # one prompt: n alone is check_request's
    with pytest.raises(InvalidRequest) as err:
        check_batch(17, 1, max_n=16)
    assert err.value.param == "prompt" and "17 in all" in err.value.message
    with pytest.raises(InvalidRequest):
        check_batch(5, 4, max_n=16)


@pytest.mark.parametrize("key,token", [("7", 7), ("0", 0), ("-3", -3), ("4294967295", 4294967295),
                                       ("\u00b2", None), ("\u0663", None), ("9" * 4400, None),
                                       ("12345678901", None), ("", None), ("1.5", None),
                                       (" 7", None), ("hello", None)])
def test_token_ids_are_ascii_digits_only(key: str, token: int | None) -> None:
    """"\u00b2" passes str.isdigit and int() of 4,400 digits raises: both were 500s."""
    assert token_id_of(key) == token
