"""Stream parsers: reasoning split, tool-call markup per family, no markup leaks.

Every case is fed three ways -- whole, one character at a time, and in random
chunks (hypothesis) -- and must produce the same merged events.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from frink_mlx.core.events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from frink_mlx.core.parsers import MarkupInfo, PassthroughParser, build_parser, detect_format
from frink_mlx.core.request import GenRequest, Message, Tool

HERMES = MarkupInfo(think_start="<think>", think_end="</think>", tool_call_start="<tool_call>",
                    tool_call_end="</tool_call>", tool_format="json_tools")
MISTRAL = MarkupInfo(tool_call_start="[TOOL_CALLS]", tool_format="mistral")
LLAMA3 = MarkupInfo(tool_format="llama3_json")


def chat(*tools: str, tool_choice: str = "auto") -> GenRequest:
    return GenRequest(model="m", messages=[Message("user", "hi")],
                      tools=[Tool(name) for name in tools], tool_choice=tool_choice)


def run(markup: MarkupInfo, req: GenRequest, chunks: list[str]) -> tuple[list[Event], bool]:
    parser = build_parser(markup, req)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return events, parser.saw_tool_call


def merged(events: list[Event]) -> list[tuple]:
    """Adjacent text/reasoning/argument deltas merged; call ids normalised."""
    out: list[tuple] = []
    for ev in events:
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            kind = type(ev).__name__
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + ev.text)
            else:
                out.append((kind, ev.text))
        elif isinstance(ev, ToolCallStart):
            assert ev.id.startswith("call_")
            out.append(("start", ev.call_index, ev.name))
        elif isinstance(ev, ToolCallDelta):
            if out and out[-1][0] == "args" and out[-1][1] == ev.call_index:
                out[-1] = ("args", ev.call_index, out[-1][2] + ev.arguments)
            else:
                out.append(("args", ev.call_index, ev.arguments))
        elif isinstance(ev, ToolCallEnd):
            out.append(("end", ev.call_index, ev.arguments))
    return out


def all_ways(markup: MarkupInfo, req: GenRequest, text: str) -> list[tuple]:
    whole, saw = run(markup, req, [text])
    per_char, saw2 = run(markup, req, list(text))
    assert merged(whole) == merged(per_char)
    assert saw == saw2
    return merged(whole)


def test_plain_text_passes_through() -> None:
    assert all_ways(HERMES, chat(), "Hello there, <b>world</b>!") == [
        ("TextDelta", "Hello there, <b>world</b>!")]


def test_think_block_split_and_whitespace_after_dropped() -> None:
    got = all_ways(HERMES, chat(), "<think>\nLet me see.\n</think>\n\nParis.")
    assert got == [("ReasoningDelta", "\nLet me see.\n"), ("TextDelta", "Paris.")]


def test_prompt_opened_think_block() -> None:
    markup = MarkupInfo(think_start="<think>", think_end="</think>", prompt_opens_thinking=True)
    got = all_ways(markup, chat(), "Because 2+2=4.</think>The answer is 4.")
    assert got == [("ReasoningDelta", "Because 2+2=4."), ("TextDelta", "The answer is 4.")]


def test_default_think_markers_only_at_reply_start() -> None:
    got = all_ways(MarkupInfo(), chat(), "<think>hm</think>ok, <think> is a tag")
    assert got == [("ReasoningDelta", "hm"), ("TextDelta", "ok, <think> is a tag")]
    assert all_ways(MarkupInfo(), chat(), "I <think> so") == [("TextDelta", "I <think> so")]


def test_model_specific_think_markers() -> None:
    markup = MarkupInfo(think_start="<|channel>thought", think_end="<channel|>")
    got = all_ways(markup, chat(), "<|channel>thoughtplan<channel|>done")
    assert got == [("ReasoningDelta", "plan"), ("TextDelta", "done")]


def test_unterminated_reasoning_flushes_as_reasoning() -> None:
    assert all_ways(HERMES, chat(), "<think>still going") == [("ReasoningDelta", "still going")]


def test_hermes_tool_call_streams_arguments() -> None:
    text = ('Let me check.<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 2}}\n</tool_call>')
    got = all_ways(HERMES, chat("get_weather"), text)
    args = '{"city": "Paris", "days": 2}'
    assert got == [("TextDelta", "Let me check."), ("start", 0, "get_weather"),
                   ("args", 0, args), ("end", 0, args)]
    per_char, saw = run(HERMES, chat("get_weather"), list(text))
    assert saw
    deltas = [e for e in per_char if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 5, "arguments must stream, not arrive at the end"
    start_pos = next(i for i, e in enumerate(per_char) if isinstance(e, ToolCallStart))
    assert all(per_char.index(d) > start_pos for d in deltas)


def test_two_calls_and_reasoning_first() -> None:
    text = ('<think>need both</think>\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {"x": [1, {"y": "}"}]}}</tool_call>')
    got = all_ways(HERMES, chat("a", "b"), text)
    assert got == [("ReasoningDelta", "need both"),
                   ("start", 0, "a"), ("args", 0, "{}"), ("end", 0, "{}"),
                   ("start", 1, "b"), ("args", 1, '{"x": [1, {"y": "}"}]}'),
                   ("end", 1, '{"x": [1, {"y": "}"}]}')]


def test_call_to_tool_not_offered_is_dropped_without_leaking() -> None:
    text = 'ok<tool_call>{"name": "rm_rf", "arguments": {"path": "/"}}</tool_call> done'
    events, saw = run(HERMES, chat("get_weather"), list(text))
    assert merged(events) == [("TextDelta", "okdone")]
    assert not saw


def test_tool_choice_none_and_named() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert all_ways(HERMES, chat("a", tool_choice="none"), text) == []
    assert all_ways(HERMES, chat("a", "b", tool_choice="b"), text) == []
    assert all_ways(HERMES, chat("a", "b", tool_choice="a"), text)[0] == ("start", 0, "a")


def test_arguments_before_name_and_string_arguments() -> None:
    text = ('<tool_call>{"arguments": {"q": 1}, "name": "a"}</tool_call>'
            '<tool_call>{"name": "a", "arguments": "{\\"q\\": 2}"}</tool_call>')
    got = all_ways(HERMES, chat("a"), text)
    assert got == [("start", 0, "a"), ("args", 0, '{"q": 1}'), ("end", 0, '{"q": 1}'),
                   ("start", 1, "a"), ("args", 1, '{"q": 2}'), ("end", 1, '{"q": 2}')]


def test_malformed_body_dropped_and_truncated_call_closed() -> None:
    assert all_ways(HERMES, chat("a"), "x<tool_call>not json</tool_call>y") == [
        ("TextDelta", "xy")]
    events, saw = run(HERMES, chat("a"), ['<tool_call>{"name": "a", "arguments": {"q": "tru'])
    assert saw and isinstance(events[-1], ToolCallEnd)


def test_partial_marker_held_back_then_released() -> None:
    parser = build_parser(HERMES, chat("a"))
    assert merged(parser.feed("a <tool")) == [("TextDelta", "a ")]
    assert merged(parser.feed("box>")) == [("TextDelta", "<toolbox>")]
    assert merged(parser.finish()) == []


def test_mistral_json_list_and_header_forms() -> None:
    got = all_ways(MISTRAL, chat("a", "b"),
                   'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"k": 1}}, '
                   '{"name": "b", "arguments": {}}]')
    assert got == [("TextDelta", "Sure."), ("start", 0, "a"), ("args", 0, '{"k": 1}'),
                   ("end", 0, '{"k": 1}'), ("start", 1, "b"), ("args", 1, "{}"), ("end", 1, "{}")]
    got = all_ways(MISTRAL, chat("a"), '[TOOL_CALLS]a[ARGS]{"k": "v"}')
    assert got == [("start", 0, "a"), ("args", 0, '{"k": "v"}'), ("end", 0, '{"k": "v"}')]


def test_llama3_json_reply_and_python_tag() -> None:
    got = all_ways(LLAMA3, chat("f"), ' {"name": "f", "parameters": {"n": 3}}')
    assert got == [("start", 0, "f"), ("args", 0, '{"n": 3}'), ("end", 0, '{"n": 3}')]
    got = all_ways(LLAMA3, chat("f"), '<|python_tag|>{"name": "f", "parameters": {}}; '
                                      '{"name": "f", "parameters": {"a": 1}}')
    assert [g[0] for g in got] == ["start", "args", "end", "start", "args", "end"]


def test_llama3_json_reply_that_is_not_a_call_stays_text() -> None:
    assert all_ways(LLAMA3, chat("f"), '{"answer": 42}') == [("TextDelta", '{"answer": 42}')]
    # no tools offered: a JSON reply is never guessed to be a call
    assert all_ways(LLAMA3, chat(), '{"name": "f", "parameters": {}}') == [
        ("TextDelta", '{"name": "f", "parameters": {}}')]


def test_unknown_family_markers_cut_out() -> None:
    markup = MarkupInfo(tool_call_start="<|tool_call_start|>", tool_call_end="<|tool_call_end|>",
                        tool_format="pythonic")
    got = all_ways(markup, chat("f"), "a<|tool_call_start|>[f(x=1)]<|tool_call_end|>b")
    assert got == [("TextDelta", "ab")]


def test_raw_prompt_gets_passthrough() -> None:
    parser = build_parser(HERMES, GenRequest(model="m", prompt="<think>"))
    assert isinstance(parser, PassthroughParser)
    assert parser.feed("<tool_call>") == [TextDelta("<tool_call>")]


def test_detect_format_from_template() -> None:
    assert detect_format("{{ '<tool_call>' }}") == "json_tools"
    assert detect_format("{{ '<tool_call>\\n<function=' }}") == "qwen3_coder"
    assert detect_format("[TOOL_CALLS]") == "mistral"
    assert detect_format("<|python_tag|>") == "llama3_json"
    assert detect_format("{{ messages }}") is None


SAMPLE = ('<think>a < b</think>\n\nHi <i>x</i> <tool_call>{"name": "a", "arguments": '
          '{"s": "</tool_call"}}</tool_call>\n<tool_call>{"name": "zz", "arguments": {}}'
          '</tool_call>bye <tool')


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    bounds = sorted({0, len(SAMPLE), *cuts})
    chunks = [SAMPLE[a:b] for a, b in zip(bounds, bounds[1:])]
    events, saw = run(HERMES, chat("a"), chunks)
    assert saw
    got = merged(events)
    assert got == all_ways(HERMES, chat("a"), SAMPLE)
    text = "".join(g[1] for g in got if g[0] == "TextDelta")
    assert "<tool_call>" not in text and "</think>" not in text
    end = next(g for g in got if g[0] == "end")
    assert json.loads(end[2]) == {"s": "</tool_call"}


def test_unknown_format_with_tools_falls_back_to_hermes() -> None:
    text = 'x<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert all_ways(MarkupInfo(), chat("f"), text) == [
        ("TextDelta", "x"), ("start", 0, "f"), ("args", 0, "{}"), ("end", 0, "{}")]
    assert all_ways(MarkupInfo(), chat(), text) == [("TextDelta", text)]


def test_qwen3_coder_xml_calls_take_schema_types() -> None:
    markup = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                        tool_format="qwen3_coder")
    req = chat()
    req.tools = [Tool("f", parameters={"type": "object", "properties": {
        "zip": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array"}}})]
    text = ("ok<tool_call>\n<function=f>\n<parameter=zip>\n01234\n</parameter>\n"
            "<parameter=n>\n3\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n"
            "</function>\n</tool_call>")
    got = all_ways(markup, req, text)
    args = json.dumps({"zip": "01234", "n": 3, "tags": ["a"]})
    assert got == [("TextDelta", "ok"), ("start", 0, "f"), ("args", 0, args), ("end", 0, args)]


def test_parallel_tool_calls_off_keeps_the_first_call() -> None:
    req = chat("a", "b")
    req.parallel_tool_calls = False
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert all_ways(HERMES, req, text) == [("start", 0, "a"), ("args", 0, "{}"), ("end", 0, "{}")]
    got = all_ways(MISTRAL, req, '[TOOL_CALLS][{"name": "b", "arguments": {}}, '
                                 '{"name": "a", "arguments": {}}]')
    assert [g for g in got if g[0] == "start"] == [("start", 0, "b")]


def test_a_call_cut_inside_its_end_marker_leaks_no_markup() -> None:
    """Issue 23: generation stopped by `length` inside `</tool_call>`."""
    body = '<tool_call>\n{"name": "f", "arguments": {"city": "Paris"}}\n</tool_call'
    for chunks in ([body], list(body)):
        events, saw = run(HERMES, chat("f"), chunks)
        ends = [e for e in events if isinstance(e, ToolCallEnd)]
        assert saw and [json.loads(e.arguments) for e in ends] == [{"city": "Paris"}]
        args = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
        assert "<" not in args and json.loads(args) == {"city": "Paris"}
        assert not any(isinstance(e, TextDelta) for e in events)
