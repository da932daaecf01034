"""Tool-call formats of Gemma 4, GLM-4.5/4.7, Kimi K2, MiniMax-M2 and DeepSeek-V3.1.

Each text is what the family's own chat template writes for an earlier call
(so what the model writes), fed whole, per character and split at every point.
"""

from __future__ import annotations

import json

from parser_support import call, chat, every_split, run

from frink_mlx.core.events import TextDelta, ToolCallEnd
from frink_mlx.core.parsers import MarkupInfo, detect_format
from frink_mlx.core.parsers.calls import typed_value
from frink_mlx.core.request import Tool

THINK = {"think_start": "<think>", "think_end": "</think>"}
GEMMA4 = MarkupInfo(think_start="<|channel>thought", think_end="<channel|>",
                    tool_call_start="<|tool_call>", tool_call_end="<tool_call|>", tool_format="gemma4")
GLM = MarkupInfo(**THINK, tool_format="glm47")
KIMI = MarkupInfo(**THINK, tool_format="kimi_k2")
MINIMAX = MarkupInfo(**THINK, tool_format="minimax_m2", prompt_opens_thinking=True)
DEEPSEEK = MarkupInfo(**THINK, tool_format="deepseek_v31")
WEATHER = Tool("get_weather", parameters={"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "zip": {"type": "string"},
    "tags": {"type": "array"}}})

Q = '<|"|>'


def test_gemma4_thought_call_and_tool_response_marker() -> None:
    text = (f"<|channel>thought\nThe user wants weather.<channel|>Checking."
            f"<|tool_call>call:get_weather{{city:{Q}Paris, France{Q},days:2}}<tool_call|>"
            "<|tool_response>")
    got = every_split(GEMMA4, chat(WEATHER), text)
    args = json.dumps({"city": "Paris, France", "days": 2})
    assert got == [("reasoning", "\nThe user wants weather."), ("text", "Checking."),
                   *call(0, "get_weather", args)]


def test_gemma4_nested_values_and_two_calls() -> None:
    text = (f"<|tool_call>call:f{{q:{Q}a{{b}},c:d{Q},opts:{{deep:[1,2.5,true,null,{Q}x{Q}]}}}}"
            f"<tool_call|><|tool_call>call:g{{}}<tool_call|>")
    got = every_split(GEMMA4, chat("f", "g"), text)
    args = json.dumps({"q": "a{b},c:d", "opts": {"deep": [1, 2.5, True, None, "x"]}})
    assert got == [*call(0, "f", args), *call(1, "g", "{}")]


def test_gemma4_malformed_call_is_dropped_and_the_text_goes_on() -> None:
    text = f"a<|tool_call>call:f{{q:{Q}unterminated}}<tool_call|>b <|tool_response> c"
    assert every_split(GEMMA4, chat("f"), text) == [("text", "ab <|tool_response> c")]


def test_glm45_newline_form_with_schema_types() -> None:
    text = ("<think>Need it.</think>Let me look.<tool_call>get_weather\n"
            "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
            "<arg_key>zip</arg_key>\n<arg_value>01234</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
            '<arg_key>tags</arg_key>\n<arg_value>["a", "b"]</arg_value>\n</tool_call>')
    got = every_split(GLM, chat(WEATHER), text)
    args = json.dumps({"city": "Paris", "zip": "01234", "days": 3, "tags": ["a", "b"]})
    assert got == [("reasoning", "Need it."), ("text", "Let me look."), *call(0, "get_weather", args)]


def test_glm47_compact_form_zero_argument_call_and_opened_thinking() -> None:
    markup = MarkupInfo(**THINK, tool_format="glm47", prompt_opens_thinking=True)
    text = ("Two calls.</think><tool_call>f<arg_key>n</arg_key><arg_value>7</arg_value>"
            "<arg_key>s</arg_key><arg_value>hi there</arg_value></tool_call>"
            "<tool_call>g</tool_call>")
    got = every_split(markup, chat("f", "g"), text)
    assert got == [("reasoning", "Two calls."), *call(0, "f", json.dumps({"n": 7, "s": "hi there"})),
                   *call(1, "g", "{}")]


def test_glm_malformed_call_dropped() -> None:
    text = "x<tool_call>not a name here<arg_key>k</arg_key></tool_call>y"
    events, saw = run(GLM, chat("f"), [text])
    assert not saw and [e.text for e in events if isinstance(e, TextDelta)] == ["x", "y"]


def test_kimi_k2_section_with_two_calls() -> None:
    text = ("<think>Both.</think>On it.<|tool_calls_section_begin|>"
            '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}'
            "<|tool_call_end|><|tool_call_begin|>functions.get_weather:1"
            '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>')
    got = every_split(KIMI, chat(WEATHER), text)
    assert got == [("reasoning", "Both."), ("text", "On it."),
                   *call(0, "get_weather", '{"city": "Paris"}'),
                   *call(1, "get_weather", '{"city": "Oslo"}')]


def test_kimi_k2_malformed_call_left_out_the_good_one_kept() -> None:
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
            "<|tool_call_argument_begin|>{broken<|tool_call_end|><|tool_call_begin|>functions.f:1"
            '<|tool_call_argument_begin|>{"ok": true}<|tool_call_end|><|tool_calls_section_end|>')
    assert every_split(KIMI, chat("f"), text) == call(0, "f", '{"ok": true}')
    assert every_split(KIMI, chat("f"), "a<|tool_calls_section_begin|>junk"
                                        "<|tool_calls_section_end|>b") == [("text", "ab")]


def test_minimax_m2_two_invokes_after_prompt_opened_thinking() -> None:
    text = ("Plan.\n</think>\n\nSure.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
            "<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n"
            "</invoke>\n<invoke name=\"get_weather\">\n<parameter name=\"zip\">007</parameter>\n"
            "<parameter name=\"note\">3</parameter>\n</invoke>\n</minimax:tool_call>")
    got = every_split(MINIMAX, chat(WEATHER), text)
    assert got == [("reasoning", "Plan.\n"), ("text", "Sure.\n"),
                   *call(0, "get_weather", json.dumps({"city": "Paris", "days": 2})),
                   *call(1, "get_weather", json.dumps({"zip": "007", "note": "3"}))]


def test_minimax_m2_malformed_dropped() -> None:
    text = "a<minimax:tool_call><invoke>nothing</invoke></minimax:tool_call>b"
    assert every_split(MINIMAX, chat("f"), text) == [("reasoning", text)]
    plain = MarkupInfo(tool_format="minimax_m2")
    assert every_split(plain, chat("f"), text) == [("text", "ab")]


def test_deepseek_v31_calls_and_v3_fenced_form() -> None:
    text = ("Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
            '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>'
            'get_weather\n```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>')
    got = every_split(DEEPSEEK, chat(WEATHER), text)
    assert got == [("text", "Let me check."), *call(0, "get_weather", '{"city": "Paris"}'),
                   *call(1, "get_weather", '{"city": "Oslo"}')]


def test_deepseek_v31_thinking_opened_by_the_prompt() -> None:
    markup = MarkupInfo(**THINK, tool_format="deepseek_v31", prompt_opens_thinking=True)
    text = ("Hmm.</think>Call.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    assert every_split(markup, chat("f"), text) == [("reasoning", "Hmm."), ("text", "Call."),
                                                    *call(0, "f", "{}")]


def test_not_offered_parallel_off_and_cut_short() -> None:
    text = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>rm<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
            "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"n\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    assert every_split(DEEPSEEK, chat("f", parallel=False), text) == call(0, "f", "{}")
    events, saw = run(DEEPSEEK, chat("f"), [text[:-40]])   # the length limit inside the section
    assert saw and [e.arguments for e in events if isinstance(e, ToolCallEnd)] == ["{}"]


def test_detect_format_for_the_new_families() -> None:
    assert detect_format("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"
    assert detect_format("{{ '<|tool_call>call:' + name }}<tool_call|>") == "gemma4"
    assert detect_format("{{ '<tool_call>' + tc.name }}<arg_key>{{ k }}</arg_key>") == "glm47"
    assert detect_format("<|tool_calls_section_begin|>") == "kimi_k2"
    assert detect_format("{{ toolcall }}<minimax:tool_call>") == "minimax_m2"
    assert detect_format("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}") == "deepseek_v31"
    assert detect_format("{{ '<tool_call>' }}") == "json_tools"


def test_typed_value_follows_the_schema() -> None:
    assert typed_value("01", {"type": "string"}) == "01"
    assert typed_value("01", {"type": ["string", "null"]}) == "01"
    assert typed_value("null", {"type": "string"}) is None
    assert typed_value("3", {"type": "integer"}) == 3
    assert typed_value("3", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) == 3
    assert typed_value("[1]", None) == [1] and typed_value("3", None) == "3"
    assert typed_value("3", None, "json") == 3 and typed_value("[1]", None, "text") == "[1]"
    assert typed_value("not json", {"type": "object"}) == "not json"
