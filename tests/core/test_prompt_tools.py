"""core/prompt.py rule 6: tools reach a model whose chat template never reads `tools`.

SmolLM2's own template (read from the packaged GGUF) ignores `tools=`; the
rendered prompt must still carry the Hermes `<tools>` block, and the parser
must then expect Hermes `<tool_call>` markup. Templates that do read `tools`
are left to render them themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from frink_mlx.core.events import ToolCallStart
from frink_mlx.core.parsers import MarkupInfo, build_parser
from frink_mlx.core.prompt import render_prompt, template_reads_tools
from frink_mlx.core.request import GenRequest, Message, Tool, ToolCall
from frink_mlx.serving.handles import DecodeHandles

WEATHER = Tool("get_weather", "Current weather in a city.",
               {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]})
TOOLS_AWARE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def smollm2_template(smollm2_gguf_path: Path) -> str:
    from gguf import GGUFReader

    field = GGUFReader(str(smollm2_gguf_path)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def _chat(*messages: Message, tools: list[Tool] | None = None, **kw: Any) -> GenRequest:
    return GenRequest(model="m", messages=list(messages), tools=tools or [], **kw)


def test_smollm2_template_does_not_read_tools(tokenizer: Any, smollm2_template: str) -> None:
    assert not template_reads_tools(tokenizer, smollm2_template)
    assert template_reads_tools(tokenizer, TOOLS_AWARE)
    assert template_reads_tools(tokenizer, None) is False   # the tiny ChatML template
    assert template_reads_tools(None, {"default": "x", "tool_use": "{{ tools }}"})  # type: ignore[arg-type]


def test_tools_block_injected_into_smollm2_system(tokenizer: Any, smollm2_template: str) -> None:
    req = _chat(Message("user", "Weather in Paris?"), tools=[WEATHER])
    rendered = render_prompt(tokenizer, req, template=smollm2_template)
    text = rendered.text or ""
    assert rendered.injected_tools
    # no system message sent: ours replaces the template's default one, and comes first
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "named SmolLM" not in text
    signature = json.dumps({"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": WEATHER.parameters}})
    assert f"<tools>\n{signature}\n</tools>" in text
    assert "<tool_call>\n{\"name\": <function-name>" in text
    assert text.endswith("<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n")


def test_existing_system_message_keeps_its_text_first(tokenizer: Any, smollm2_template: str
                                                      ) -> None:
    req = _chat(Message("system", "Be brief."), Message("user", "hi"), tools=[WEATHER])
    text = render_prompt(tokenizer, req, template=smollm2_template).text or ""
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


def test_history_calls_written_as_hermes_markup(tokenizer: Any, smollm2_template: str) -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    req = _chat(Message("user", "Weather?"), Message("assistant", "", tool_calls=[call]),
                Message("tool", "18C", tool_call_id="call_1", name="get_weather"),
                tools=[WEATHER])
    text = render_prompt(tokenizer, req, template=smollm2_template).text or ""
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>') in text
    assert "<|im_start|>tool\n18C<|im_end|>" in text


def test_no_injection_without_tools_or_with_tool_choice_none(tokenizer: Any,
                                                             smollm2_template: str) -> None:
    plain = render_prompt(tokenizer, _chat(Message("user", "hi")), template=smollm2_template)
    off = render_prompt(tokenizer, _chat(Message("user", "hi"), tools=[WEATHER],
                                         tool_choice="none"), template=smollm2_template)
    assert not plain.injected_tools and not off.injected_tools
    assert plain.text == off.text and "<tools>" not in (plain.text or "")


def test_tools_aware_template_renders_them_itself(tokenizer: Any) -> None:
    rendered = render_prompt(tokenizer, _chat(Message("user", "hi"), tools=[WEATHER]),
                             template=TOOLS_AWARE)
    assert not rendered.injected_tools
    assert (rendered.text or "").startswith("<|im_start|>system\nTOOLS:[")
    assert "# Tools" not in (rendered.text or "")


def test_prepare_makes_the_parser_expect_hermes_calls(tokenizer: Any, smollm2_template: str
                                                       ) -> None:
    # a model whose tokenizer knows another tool format: the injected block asked for Hermes
    markup = MarkupInfo(tool_call_start="[TOOL_CALLS]", tool_format="mistral")
    handles = DecodeHandles(None, None, tokenizer, None, 4096, markup, None,  # type: ignore[arg-type]
                            frozenset(), smollm2_template)
    req = _chat(Message("user", "Weather in Paris?"), tools=[WEATHER])
    prepared = handles.prepare(req)
    assert prepared.markup.tool_format == "json_tools"
    assert prepared.markup.tool_call_start == "<tool_call>"
    parser = build_parser(prepared.markup, req)
    events = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                         '\n</tool_call>') + parser.finish()
    assert any(isinstance(e, ToolCallStart) and e.name == "get_weather" for e in events)
    assert parser.saw_tool_call
    plain = handles.prepare(_chat(Message("user", "hi")))
    assert plain.markup.tool_format == "mistral"
