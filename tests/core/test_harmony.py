"""gpt-oss Harmony: analysis -> reasoning, commentary to functions.* -> tool calls, final -> text."""

from __future__ import annotations

import json

from parser_support import call, chat, every_split, run

from frink_mlx.core.events import ToolCallDelta, ToolCallStart
from frink_mlx.core.parsers import HarmonyStreamParser, MarkupInfo, build_parser
from frink_mlx.core.request import GenRequest

HARMONY = MarkupInfo(tool_format="harmony")
ANALYSIS = "<|channel|>analysis<|message|>User wants weather.<|end|>"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json'
        '<|message|>{"city": "Paris"}<|call|>')


def test_analysis_then_final() -> None:
    text = ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is **sunny**.<|return|>"
    assert every_split(HARMONY, chat(), text) == [("reasoning", "User wants weather."),
                                                  ("text", "It is **sunny**.")]


def test_analysis_then_call_streams_its_arguments() -> None:
    got = every_split(HARMONY, chat("get_weather"), ANALYSIS + CALL)
    assert got == [("reasoning", "User wants weather."),
                   *call(0, "get_weather", '{"city": "Paris"}')]
    events, saw = run(HARMONY, chat("get_weather"), list(ANALYSIS + CALL))
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert saw and len(deltas) > 5, "arguments stream as they are generated"


def test_stop_token_ends_the_call_and_the_older_header_form() -> None:
    # <|call|> is a stop token: the text simply ends. The recipient may come before the channel.
    text = ('<|channel|>commentary to=functions.f<|message|>{"a": 1}<|end|>'
            '<|start|>assistant to=functions.g<|channel|>commentary json<|message|> {"b": [2]}\n')
    assert every_split(HARMONY, chat("f", "g"), text) == [*call(0, "f", '{"a": 1}'),
                                                          *call(1, "g", '{"b": [2]}')]


def test_preamble_is_text_and_builtin_and_unoffered_recipients_are_dropped() -> None:
    text = ("<|channel|>commentary<|message|>Looking it up.<|end|>"
            '<|start|>assistant<|channel|>analysis to=browser.search<|message|>{"query": "x"}<|call|>'
            '<|start|>assistant<|channel|>commentary to=functions.rm_rf<|message|>{}<|call|>'
            "<|start|>assistant<|channel|>final<|message|>Done.")
    events, saw = run(HARMONY, chat("get_weather"), [text])
    assert not saw
    assert every_split(HARMONY, chat("get_weather"), text) == [("text", "Looking it up.Done.")]


def test_tool_choice_none_and_parallel_off() -> None:
    two = CALL + CALL.replace("Paris", "Oslo")
    assert every_split(HARMONY, chat("get_weather", tool_choice="none"), two) == []
    assert every_split(HARMONY, chat("get_weather", parallel=False), two) == \
        call(0, "get_weather", '{"city": "Paris"}')


def test_a_reply_without_headers_is_text() -> None:
    assert every_split(HARMONY, chat(), "Plain answer, no channels.") == [
        ("text", "Plain answer, no channels.")]
    assert every_split(HARMONY, chat(), '{"city": "Paris"}') == [("text", '{"city": "Paris"}')]
    text = "Hi.<|start|>assistant<|channel|>final<|message|>Then this."
    assert every_split(HARMONY, chat(), text) == [("text", "Hi.Then this.")]


def test_malformed_calls_are_dropped_not_raised() -> None:
    text = ("<|channel|>commentary to=functions.f<|message|>not json<|call|>"
            '<|start|>assistant<|channel|>commentary to=functions.f<|message|>"{\\"k\\": 1}"<|call|>'
            "<|start|>assistant<|channel|>final<|message|>ok")
    assert every_split(HARMONY, chat("f"), text) == [*call(0, "f", '{"k": 1}'), ("text", "ok")]
    assert every_split(HARMONY, chat("f"), "<|channel|>final<|mess") == []


def test_a_call_cut_short_ends_with_what_was_sent() -> None:
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"path": "a.txt", "te'
    events, saw = run(HARMONY, chat("f"), list(text))
    got = every_split(HARMONY, chat("f"), text)
    assert saw and got == call(0, "f", '{"path": "a.txt", "te')
    assert isinstance(events[0], ToolCallStart)


def test_harmony_format_builds_the_harmony_parser() -> None:
    assert isinstance(build_parser(HARMONY, chat()), HarmonyStreamParser)
    raw = build_parser(HARMONY, GenRequest(model="m", prompt="x"))
    assert not isinstance(raw, HarmonyStreamParser)


def test_long_call_arguments_arrive_whole() -> None:
    content = "line\n" * 2000
    body = json.dumps({"path": "f.txt", "content": content})
    text = f"<|channel|>commentary to=functions.write<|message|>{body}<|call|>"
    events, _ = run(HARMONY, chat("write"), [text[i:i + 3] for i in range(0, len(text), 3)])
    sent = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert json.loads(sent) == {"path": "f.txt", "content": content}
