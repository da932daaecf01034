"""Every generating route reports model, tokens and TTFT to the metrics (http/access.py rule 3).

The runs Frontend.generate starts are tracked per request, so OpenAI chat and
completions, Responses, Anthropic messages and llama.cpp /completion and /infill
all move the same counters -- streamed or not -- without noting anything themselves.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frink_mlx.http.access import runs_tally

MSGS = [{"role": "user", "content": "hi"}]
N = 4
REQUESTS = [
    ("/v1/chat/completions", {"model": "tiny", "messages": MSGS, "max_tokens": N}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": N}),
    ("/v1/completions", {"model": "tiny", "prompt": ["hi", "yo"], "max_tokens": N}),
    ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": N}),
    ("/v1/messages", {"model": "tiny", "messages": MSGS, "max_tokens": N}),
    ("/completion", {"model": "tiny", "prompt": "hi", "n_predict": N}),
    ("/infill", {"model": "coder", "input_prefix": "def f(", "input_suffix": ")",
                 "n_predict": N}),
]


@pytest.fixture(scope="module")
def http(live: Any) -> httpx.Client:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def _sample(http: httpx.Client, name: str, model: str) -> float:
    text = http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("model") == model:
                return float(sample.value)
    return 0.0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body", REQUESTS, ids=lambda v: v if isinstance(v, str) else "")
def test_route_moves_token_and_ttft_metrics(http: httpx.Client, path: str, body: dict[str, Any],
                                            stream: bool) -> None:
    model = body["model"]
    runs = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    names = ("frink_generation_tokens_total", "frink_prompt_tokens_total",
             "frink_time_to_first_token_seconds_count")
    before = [_sample(http, name, model) for name in names]
    body = {**body, "temperature": 0, "ignore_eos": True, "stream": stream}
    if path in ("/v1/responses", "/v1/messages"):
        body.pop("ignore_eos")
    if path in ("/v1/responses", "/v1/messages") and not stream:
        body.pop("stream")
    resp = http.post(path, json=body)
    assert resp.status_code == 200, resp.text
    # the access middleware records once the response has ended, just after the client saw it
    deadline = time.monotonic() + 5.0
    while True:
        after = [_sample(http, name, model) for name in names]
        if after[2] > before[2] or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    # the TTFT count moves last; a scrape racing the update may have seen it half done
    after = [_sample(http, name, model) for name in names]
    generated = after[0] - before[0]
    assert 1 <= generated <= N * runs
    if model == "tiny" and path not in ("/v1/responses", "/v1/messages"):
        # ignore_eos on the real engine: exactly N per run ("coder" is scripted)
        assert generated == N * runs
    assert after[1] > before[1]
    if path == "/v1/completions" and runs == 2:   # every run counts, not only the first
        assert after[1] - before[1] == 4
    assert after[2] == before[2] + 1


class _FakeRun:
    def __init__(self, **tally: Any) -> None:
        self._tally = tally

    def tally(self) -> dict[str, Any]:
        return self._tally


def test_runs_tally_sums_tokens_and_takes_the_earliest_ttft() -> None:
    runs = [_FakeRun(model="m", generation=2, prompt_tokens=3, completion_tokens=4,
                     cached_tokens=1, ttft_s=0.5),
            _FakeRun(model="m", generation=2, prompt_tokens=5, completion_tokens=6,
                     cached_tokens=0, ttft_s=None)]
    assert runs_tally(runs) == {"model": "m", "generation": 2, "prompt_tokens": 8,
                                "completion_tokens": 10, "cached_tokens": 1, "ttft_s": 0.5}
    assert runs_tally([]) == {}
