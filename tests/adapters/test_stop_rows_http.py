"""n > 1 with a stop string one choice hits early (OpenAI chat, real tiny engine).

That choice ends with finish_reason "stop" and its engine row is aborted at
once (handles.py rule 9): the engine generates only the tokens up to the stop
(plus at most one step in flight) for it, while the other choices' text is the
same as without the stop string.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

MAX_TOKENS = 24


@pytest.fixture
def client(live: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _ask(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "three ways"}], n=3, seed=5,
        temperature=1.0, max_tokens=MAX_TOKENS, **extra)


def _stop_for(texts: list[str]) -> tuple[str, int]:
    """A short piece early in choice 1 that choices 0 and 2 never contain."""
    for start in range(2, len(texts[1]) - 3):
        for size in (2, 3, 4):
            piece = texts[1][start:start + size]
            if piece.strip() and texts[1].find(piece) == start and \
                    piece not in texts[0] and piece not in texts[2]:
                return piece, start
    pytest.skip("no distinguishing stop string in these random texts")


def test_a_stopped_choice_stops_decoding_and_the_others_are_unchanged(
        client: openai.OpenAI, live: Any) -> None:
    free = _ask(client)
    texts = [c.message.content for c in sorted(free.choices, key=lambda c: c.index)]
    assert all(c.finish_reason == "length" for c in free.choices)
    stop, at = _stop_for(texts)
    engine = live.state.hub.current.engine
    before = engine.stats().generated_tokens_total
    stopped = _ask(client, stop=[stop])
    generated = engine.stats().generated_tokens_total - before
    got = {c.index: c for c in stopped.choices}
    assert got[1].finish_reason == "stop" and got[1].message.content == texts[1][:at]
    for i in (0, 2):
        assert got[i].message.content == texts[i] and got[i].finish_reason == "length"
    row1_tokens = stopped.usage.completion_tokens - 2 * MAX_TOKENS
    assert row1_tokens < MAX_TOKENS
    assert generated <= 2 * MAX_TOKENS + row1_tokens + 2  # + the step in flight at the abort
