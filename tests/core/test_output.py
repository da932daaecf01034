"""core/output.py: UTF-8-safe incremental text, stops across token boundaries, finish, usage."""

from __future__ import annotations

from frink_mlx.core.events import Done, ErrorEvent, TextDelta
from frink_mlx.core.output import IncrementalDetokenizer, OutputPipeline, StopMatcher, TokenText
from frink_mlx.core.parsers import MarkupInfo
from frink_mlx.core.request import GenRequest, SamplingParams
from frink_mlx.engine.types import StepOutput, TopLogprob

# A byte-level toy vocabulary: each id is one byte, so multi-byte characters
# span several tokens exactly as they do in byte-level BPE.
EOS = 1000


def byte_decode(ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def ids_of(text: str) -> list[int]:
    return list(text.encode())


def pipeline(stop=(), n=1, logprobs=False, top=0, messages=False) -> OutputPipeline:
    req = GenRequest(model="m", prompt=None if messages else "x", stop=list(stop), n=n,
                     sampling=SamplingParams(logprobs=logprobs, top_logprobs=top))
    if messages:
        from frink_mlx.core.request import Message
        req.messages = [Message("user", "hi")]
    return OutputPipeline(req, MarkupInfo(), TokenText(byte_decode), prompt_tokens=7,
                          eos_ids=frozenset({EOS}))


def run(p: OutputPipeline, ids, finish="eos", index=0):
    events = []
    steps = [StepOutput(index, t, logprob=-0.5, top_logprobs=[TopLogprob(t, -0.5)],
                        num_prompt_tokens=7 if k == 0 else None,
                        num_cached_tokens=4 if k == 0 else None) for k, t in enumerate(ids)]
    steps[-1].finish = finish
    for s in steps:
        events += p.on_step(s)
    return events


def text_of(events) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_multibyte_characters_are_never_split():
    text = "héllo wörld 🎉 日本"
    events = run(pipeline(), ids_of(text) + [EOS])
    assert text_of(events) == text
    for e in events:
        if isinstance(e, TextDelta):
            assert "\ufffd" not in e.text


def test_detokenizer_holds_incomplete_bytes_until_complete():
    d = IncrementalDetokenizer(byte_decode)
    emoji = ids_of("🎉")
    assert [d.add(b) for b in emoji[:-1]] == ["", "", ""]
    assert d.add(emoji[-1]) == "🎉"
    assert d.flush() == ""


def test_stop_string_across_token_boundaries_never_leaks():
    events = run(pipeline(stop=["END"]), ids_of("abc EN") + ids_of("D tail"), finish=None)
    assert text_of(events) == "abc "
    done = [e for e in events if isinstance(e, Done)]
    assert len(done) == 1 and done[0].finish_reason == "stop"
    assert done[0].stop_kind == "stop_sequence" and done[0].stop_sequence == "END"


def test_partial_stop_is_released_when_it_does_not_complete():
    events = run(pipeline(stop=["END"]), ids_of("EN then E") + [EOS])
    assert text_of(events) == "EN then E"


def test_earliest_of_several_stops_wins():
    m = StopMatcher(["world", "lo w"])
    assert m.feed("hello world") == "hel"
    assert m.matched == "lo w"


class _NaiveStops:
    """The matcher's rule 2 written the slow, obvious way: the reference."""

    def __init__(self, stops):
        self.stops, self.held, self.matched = [s for s in stops if s], "", None

    def feed(self, text):
        if self.matched is not None:
            return ""
        buf = self.held + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            at, self.matched = min(hits, key=lambda h: h[0])
            self.held = ""
            return buf[:at]
        keep = max([n for s in self.stops for n in range(1, len(s)) if buf.endswith(s[:n])],
                   default=0)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]


def test_stop_matching_agrees_with_the_obvious_reference_on_random_text():
    import random

    rng = random.Random(5)
    for _ in range(300):
        stops = ["".join(rng.choice("ab\u00e9") for _ in range(rng.randint(1, 6)))
                 for _ in range(rng.randint(1, 5))]
        text = "".join(rng.choice("ab\u00e9c") for _ in range(rng.randint(0, 40)))
        fast, slow = StopMatcher(stops), _NaiveStops(stops)
        at = 0
        while at < len(text):
            step = rng.randint(1, 4)
            assert fast.feed(text[at:at + step]) == slow.feed(text[at:at + step]), (stops, text)
            at += step
        assert fast.matched == slow.matched and fast.flush() == ("" if slow.matched else slow.held)


def test_one_stop_set_is_shared_by_a_requests_choices():
    p = pipeline(n=3, stop=["END", "STOP"])
    sets = {id(c.stops.set) for c in p.choices}
    assert len(sets) == 1 and p.choices[0].stops.set.max_len == 4


def test_eos_ends_without_text_and_counts_usage():
    events = run(pipeline(), ids_of("hi") + [EOS])
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop" and done.stop_kind == "eos"
    assert done.usage.prompt_tokens == 7 and done.usage.cached_tokens == 4
    assert done.usage.completion_tokens == 3
    assert text_of(events) == "hi"


def test_length_finish():
    events = run(pipeline(), ids_of("abc"), finish="length")
    assert events[-1].finish_reason == "length" and text_of(events) == "abc"


def test_engine_error_becomes_error_event_and_nothing_after():
    p = pipeline()
    events = p.on_step(StepOutput(0, None, finish="error", error="boom"))
    assert events == [ErrorEvent("boom")]
    assert p.all_done


def test_n_choices_are_independent():
    p = pipeline(n=2)
    ev = run(p, ids_of("aa") + [EOS], index=0) + run(p, ids_of("bbb"), finish="length", index=1)
    assert text_of([e for e in ev if e.index == 0]) == "aa"
    assert text_of([e for e in ev if e.index == 1]) == "bbb"
    dones = {e.index: e for e in ev if isinstance(e, Done)}
    assert dones[0].usage.completion_tokens == 3 and dones[1].usage.completion_tokens == 3
    assert p.all_done


def test_logprobs_ride_on_text_and_cover_every_token():
    events = run(pipeline(logprobs=True, top=1), ids_of("é!") + [EOS])
    lps = [lp for e in events if isinstance(e, TextDelta) for lp in e.logprobs]
    assert [lp.token_id for lp in lps] == ids_of("é!")
    assert all(lp.logprob == -0.5 and len(lp.top) == 1 for lp in lps)


def test_abort_closes_open_choices():
    p = pipeline(n=2)
    p.on_step(StepOutput(0, ids_of("a")[0]))
    dones = [e for e in p.abort() if isinstance(e, Done)]
    assert [d.finish_reason for d in dones] == ["abort", "abort"]


def test_parallel_tool_calls_off_ends_the_turn_after_the_first_call():
    """Issue 23: parallel_tool_calls false stops decoding once one call is complete."""
    from frink_mlx.core.events import ToolCallEnd
    from frink_mlx.core.request import Message, Tool

    markup = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                        tool_format="json_tools")
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    for parallel, calls in ((False, 1), (True, 2)):
        req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[Tool("f")],
                         parallel_tool_calls=parallel)
        p = OutputPipeline(req, markup, TokenText(byte_decode), prompt_tokens=7,
                           eos_ids=frozenset({EOS}))
        events = run(p, ids_of(call + "\n" + call + "\n") + [EOS])
        dones = [e for e in events if isinstance(e, Done)]
        assert len([e for e in events if isinstance(e, ToolCallEnd)]) == calls
        assert len(dones) == 1 and dones[0].finish_reason == "tool_calls"
        if not parallel:  # ended right after the first call's end marker
            assert dones[0].usage.completion_tokens == len(ids_of(call))


def test_time_budget_ends_the_choice_at_a_line_end(monkeypatch):
    """Rule 8 (llama-server's t_max_predict_ms): a spent budget ends the choice only on a
    token holding a newline -- at a line's end -- as its length limit would."""
    import frink_mlx.core.output as output

    clock = [100.0]
    monkeypatch.setattr(output.time, "monotonic", lambda: clock[0])
    req = GenRequest(model="m", prompt="x", max_predict_ms=700)
    p = OutputPipeline(req, MarkupInfo(), TokenText(byte_decode), prompt_tokens=7,
                       eos_ids=frozenset({EOS}))
    events = []
    for k, t in enumerate(ids_of("ab\ncd\nef")):
        clock[0] += 0.3   # 300 ms a token: spent from "c" on, but "c", "d" end no line
        events += p.on_step(StepOutput(0, t, num_prompt_tokens=7 if k == 0 else None))
        if p.all_done:
            break
    done = [e for e in events if isinstance(e, Done)]
    assert text_of(events) == "ab\ncd\n" and len(done) == 1
    assert (done[0].finish_reason, done[0].stop_kind) == ("length", "length")
    assert done[0].usage.completion_tokens == 6


def indented(text: str, min_indent: int = 4, finish: str | None = None) -> list:
    req = GenRequest(model="m", prompt="x", min_indent=min_indent)
    p = OutputPipeline(req, MarkupInfo(), TokenText(byte_decode), prompt_tokens=7,
                       eos_ids=frozenset({EOS}))
    events = []
    ids = ids_of(text)
    for k, t in enumerate(ids):
        events += p.on_step(StepOutput(0, t, finish=finish if k == len(ids) - 1 else None))
        if p.all_done:
            break
    return events


def test_indentation_limit_cuts_the_first_line_that_leaves_the_block():
    """Rule 9 (llama-server's n_indent): the cursor's line is free, later lines need the
    indentation; the first short one ends the choice after its indentation."""
    events = indented("x = 1\n    y = 2\n\t\t\t\tz\n  w = 3\n    never")
    done = [e for e in events if isinstance(e, Done)]
    assert text_of(events) == "x = 1\n    y = 2\n\t\t\t\tz\n  "   # a tab counts as one
    assert (done[0].finish_reason, done[0].usage.completion_tokens) == ("length", 25)
    assert text_of(indented("a\n\n    b")) == "a\n"      # an empty line is short too
    ended = indented("a\n    ", finish="length")          # held indentation is released
    assert text_of(ended) == "a\n    " and isinstance(ended[-1], Done)


def test_indentation_limit_at_a_dedent_and_without_a_limit():
    events = indented("if x:\n        go()\nEND", min_indent=8)
    assert text_of(events) == "if x:\n        go()\n"
    plain = run(pipeline(), ids_of("a\nb") + [EOS])
    assert text_of(plain) == "a\nb"
