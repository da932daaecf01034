"""core/family_prompts.py, and each family's format chosen from its checkpoint's template."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from frink_mlx.core.prompt import render_prompt
from frink_mlx.core.request import GenRequest, Message, Tool, ToolCall

# DeepSeek-V3.1's official template, cut down: it never renders `tools` and joins
# an earlier call's arguments with `+`.
DEEPSEEK = (
    "{{ bos_token }}{%- for m in messages %}{%- if m['role'] == 'system' %}{{ m['content'] }}"
    "{%- elif m['role'] == 'user' %}<｜User｜>{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' and m['tool_calls'] %}<｜Assistant｜></think>"
    "{%- for tool in m['tool_calls'] %}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
    "{{ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] }}"
    "<｜tool▁call▁end｜>{%- endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{%- elif m['role'] == 'tool' %}<｜tool▁output▁begin｜>{{ m['content'] }}<｜tool▁output▁end｜>"
    "{%- endif %}{%- endfor %}{% if add_generation_prompt %}<｜Assistant｜></think>{% endif %}")
WEATHER = Tool("get_weather", "Weather of a city", {"type": "object", "properties": {
    "city": {"type": "string"}}})


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_llama_dir)


def test_deepseek_gets_its_own_tools_block_and_native_history(tokenizer) -> None:
    req = GenRequest(model="m", tools=[WEATHER], messages=[
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=[ToolCall("c1", "get_weather", '{"city": "Paris"}')]),
        Message("tool", "18C", tool_call_id="c1"), Message("user", "And Oslo?")])
    rendered = render_prompt(tokenizer, req, template=DEEPSEEK, tool_format="deepseek_v31")
    text = rendered.text or ""
    assert not rendered.injected_tools   # the deepseek_v31 parser stays
    assert "### get_weather\nDescription: Weather of a city" in text and "<tools>" not in text
    assert ('<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
            in text)
    hermes = render_prompt(tokenizer, req, template=DEEPSEEK)   # no family known: Hermes
    assert hermes.injected_tools and "<tools>" in (hermes.text or "")


TEMPLATES = {
    "harmony": "<|start|>assistant<|channel|>final<|message|>{{ messages[0].content }}<|end|>",
    "gemma4": "{{ '<|tool_call>call:' }}{{ messages[0].content }}<tool_call|>",
    "glm47": "{{ '<tool_call>' }}{{ messages[0].content }}<arg_key>k</arg_key>",
    "kimi_k2": "<|tool_calls_section_begin|>{{ messages[0].content }}",
    "minimax_m2": "{% set t = '<minimax:tool_call>' %}{{ messages[0].content }}",
    "deepseek_v31": DEEPSEEK,
}


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_the_format_is_chosen_from_the_checkpoint(tiny_llama_dir, tmp_path: Path,
                                                  family: str) -> None:
    """mlx-lm's own detection where it has the family, the template's markers elsewhere."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from frink_mlx.serving.handles import markup_of

    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_llama_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATES[family]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert markup_of(load_tokenizer(tmp_path)).tool_format == family


def test_arguments_as_text_only_where_the_template_joins_them() -> None:
    from frink_mlx.core.family_prompts import arguments_as_text

    assert arguments_as_text("{{ '<｜tool▁sep｜>' + tool['function']['arguments'] + 'x' }}")
    assert arguments_as_text(DEEPSEEK)
    assert not arguments_as_text("{{ '<｜tool▁sep｜>' + tool['function']['arguments']|tojson + 'x' }}")
    assert not arguments_as_text("{{- tool_call.arguments | tojson }}{% set a = tc.arguments %}")
    assert not arguments_as_text(None)
