"""core/offload.py: which work leaves the event loop, and core/prompt.py rule 8 (a text far
past the ceiling is refused after tokenizing its head)."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from frink_mlx.core.offload import (
    MESSAGE_CHARS,
    OFFLOAD_CHARS,
    TEXT_CHARS,
    TOOL_CHARS,
    Offload,
    input_chars,
    texts_chars,
)
from frink_mlx.core.prompt import HEAD_CHARS_PER_TOKEN, render_prompt
from frink_mlx.core.request import GenRequest, Message, Tool
from frink_mlx.errors import ContextLengthExceeded


def test_small_work_stays_on_the_loop_and_large_work_leaves_it() -> None:
    async def main() -> tuple[int, int, int]:
        offload = Offload(threshold=1000)
        here = threading.get_ident()
        small = await offload.run(999, threading.get_ident)
        large = await offload.run(1000, threading.get_ident)
        return here, small, large

    here, small, large = anyio.run(main)
    assert small == here and large != here


def test_large_jobs_run_at_most_max_threads_at_once() -> None:
    running, peak = [0], [0]
    guard = threading.Lock()

    def job() -> None:
        with guard:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with guard:
            running[0] -= 1

    async def main() -> None:
        offload = Offload(threshold=1, max_threads=2)
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(offload.run, 10, job)

    anyio.run(main)
    assert peak[0] == 2


def test_input_chars_counts_what_renders_and_stops_past_enough() -> None:
    req = GenRequest(model="m", messages=[Message("user", "x" * 10, reasoning="yy")],
                     tools=[Tool("t", "desc", {"type": "object"})])
    assert input_chars(req) == (MESSAGE_CHARS + 10 + 2 + TOOL_CHARS + 1 + 4
                                + len('{"type":"object"}'))
    assert input_chars(GenRequest(model="m", prompt=[1, 2, 3])) == 3
    many = GenRequest(model="m", messages=[Message("user", "x" * 1000)] * 100_000)
    assert OFFLOAD_CHARS <= input_chars(many) < OFFLOAD_CHARS + 1000 + MESSAGE_CHARS


def test_what_a_template_wraps_around_messages_and_tools_counts() -> None:
    """Rule 1: 512 bare tools or 2,000 short messages are large work, one of each is not."""
    tools = [Tool(f"f{i}", "", {"type": "object"}) for i in range(512)]
    hi = [Message("user", "hi")]
    assert input_chars(GenRequest(model="m", messages=hi, tools=tools)) >= OFFLOAD_CHARS
    assert input_chars(GenRequest(model="m", messages=hi * 2000)) >= OFFLOAD_CHARS
    assert input_chars(GenRequest(model="m", messages=hi, tools=tools[:1])) < OFFLOAD_CHARS


class WordTokenizer:
    """One token per space-separated word; counts what it was asked to encode."""

    bos_token = None

    def __init__(self) -> None:
        self.encoded_chars = 0

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.encoded_chars += len(text)
        return [len(word) % 7 for word in text.split(" ")]

    def __len__(self) -> int:
        return 7


def test_texts_chars_counts_an_encode_call_per_text() -> None:
    """Rule 1: a thousand short texts (llama.cpp's text logit_bias keys) are large work."""
    assert texts_chars(["ab", "c"]) == 3 + 2 * TEXT_CHARS
    assert texts_chars([f"w{i}" for i in range(1024)]) >= OFFLOAD_CHARS
    assert texts_chars(["w1"]) < OFFLOAD_CHARS


def test_a_text_far_past_the_ceiling_is_refused_from_its_head() -> None:
    tok, ceiling = WordTokenizer(), 100
    text = "a " * 1_000_000  # 2 chars a token: 1,000,000 tokens
    with pytest.raises(ContextLengthExceeded) as refused:
        render_prompt(tok, GenRequest(model="m", prompt=text), ceiling=ceiling)
    assert tok.encoded_chars == ceiling * HEAD_CHARS_PER_TOKEN  # the head only
    assert refused.value.num_tokens > ceiling and "at least" in refused.value.message
    assert refused.value.param == "prompt"


def test_a_long_text_of_long_tokens_is_still_counted_whole() -> None:
    tok, ceiling = WordTokenizer(), 100
    text = " ".join(["w" * 40] * 90)  # 41 chars a token, 90 tokens: it fits
    rendered = render_prompt(tok, GenRequest(model="m", prompt=text), ceiling=ceiling)
    assert len(rendered.ids) == 90
    unbounded = render_prompt(WordTokenizer(), GenRequest(model="m", prompt="a " * 5000))
    assert len(unbounded.ids) == 5001  # no ceiling: every token counted (count_tokens)
