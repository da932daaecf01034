"""OpenAI chunk framing in isolation: role chunks, finish chunks, usage, mid-stream errors."""

from __future__ import annotations

import asyncio
import json

from frink_mlx.adapters.openai.frames import chat_frames
from frink_mlx.core.events import Done, ErrorEvent, TextDelta, ToolCallDelta, ToolCallStart, Usage


class FakeRun:
    id, model, generation, created, n, prompt_tokens = "r1", "m", 3, 1, 2, 5

    def __init__(self, events):
        self._events = events

    async def events(self):
        for e in self._events:
            yield e


def frames(events, include_usage=True, n_choices=2):
    async def collect():
        return [f async for f in chat_frames(FakeRun(events), include_usage, False, n_choices)]

    return asyncio.run(collect())


def payloads(out):
    return [json.loads(f[6:]) for f in out if f.startswith("data: {")]


def test_chunks_for_two_choices_with_usage():
    usage = Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=0)
    out = frames([TextDelta("a", 0), TextDelta("b", 1), Done("stop", usage, index=0),
                  ToolCallStart(0, "call_1", "f", index=1), ToolCallDelta(0, "{}", index=1),
                  Done("tool_calls", usage, index=1)])
    chunks = payloads(out)
    # each choice's role chunk comes right before its first real delta (issue 23: not
    # before prefill), with content null as llama-server sends it
    role = {"role": "assistant", "content": None}
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks[:4]] == [
        (0, role), (0, {"content": "a"}), (1, role), (1, {"content": "b"})]
    assert chunks[1]["choices"][0] == {"index": 0, "delta": {"content": "a"}, "logprobs": None,
                                       "finish_reason": None}
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"])
                for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finishes == [(0, "stop"), (1, "tool_calls")]
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 2
    call = chunks[5]["choices"][0]["delta"]["tool_calls"][0]
    assert call["id"] == "call_1" and call["function"]["name"] == "f"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 5
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert out[-1] == "data: [DONE]\n\n"
    assert not any("timings" in c for c in chunks)   # rule 6: one choice only


def test_one_choice_carries_llama_server_timings_on_its_finish_and_usage_chunks():
    usage = Usage(prompt_tokens=7, completion_tokens=3, cached_tokens=2)
    done = Done("length", usage, timings={"prompt_ms": 50.0, "predicted_ms": 40.0})
    chunks = payloads(frames([TextDelta("a"), done], n_choices=1))
    assert [("timings" in c) for c in chunks] == [False, False, True, True]
    timings = chunks[-1]["timings"]
    assert chunks[-2]["timings"] == timings
    assert (timings["prompt_n"], timings["cache_n"], timings["predicted_n"]) == (5, 2, 3)
    assert timings["predicted_per_second"] == 50.0   # 2 decode steps over 40 ms


def test_a_choice_without_deltas_still_gets_its_role_before_finishing():
    usage = Usage(prompt_tokens=5, completion_tokens=1, cached_tokens=0)
    chunks = payloads(frames([Done("stop", usage, index=0)], include_usage=False))
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": None}, {}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_error_mid_stream_is_one_error_frame_and_the_end():
    out = frames([TextDelta("a", 0), ErrorEvent("engine exploded"), TextDelta("never", 0)])
    last = json.loads(out[-1][6:])
    assert last["error"]["message"] == "engine exploded"
    assert "[DONE]" not in "".join(out) and "never" not in "".join(out)
