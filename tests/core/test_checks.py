"""core/checks.py: the one range check of sampling knobs and n, naming the client's field."""

from __future__ import annotations

import math

import pytest

from frink_mlx.core.checks import check_request, check_sampling
from frink_mlx.core.request import GenRequest, SamplingParams
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
