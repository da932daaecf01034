"""core/template_kwargs.py: chat_template_kwargs reach templates that read them, others refused."""

from __future__ import annotations

import pytest

from frink_mlx.core.prompt import render_prompt
from frink_mlx.core.request import GenRequest, Message
from frink_mlx.core.template_kwargs import template_variables, thinking_kwarg
from frink_mlx.errors import UnsupportedField

# Qwen3.6's switch, GLM-4.7's (inside HF's {% generation %}), and one the template sets itself.
TEMPLATE = ("{% set mode = 'x' %}{% for m in messages %}{{ m.content }}{% endfor %}"
            "{% if preserve_thinking is defined and preserve_thinking %}[keep]{% endif %}"
            "{% generation %}{% if clear_thinking is defined %}[clear={{ clear_thinking }}]"
            "{% endif %}{% endgeneration %}{{ bos_token }}")
DEEPSEEK = ("{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}"
            "<A>{% if not thinking %}</think>{% else %}<think>{% endif %}{% endif %}")
GPT_OSS = ("{%- if reasoning_effort is not defined %}{%- set reasoning_effort = 'medium' %}"
           "{%- endif %}Reasoning: {{ reasoning_effort }}|{{ messages[0].content }}")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_llama_dir)


def render(tokenizer, template: str, **fields) -> str:
    req = GenRequest(model="m", messages=[Message("user", "hi")], **fields)
    return render_prompt(tokenizer, req, template=template).text or ""


def test_keys_the_template_reads_are_passed(tokenizer) -> None:
    assert render(tokenizer, TEMPLATE) == "hi<|endoftext|>"   # bos_token: read, not settable
    got = render(tokenizer, TEMPLATE, template_kwargs={"preserve_thinking": True,
                                                       "clear_thinking": False})
    assert got == "hi[keep][clear=False]<|endoftext|>"


@pytest.mark.parametrize("key", ["unknown_switch", "mode", "messages", "add_generation_prompt",
                                 "bos_token"])
def test_other_keys_are_refused_by_name(tokenizer, key: str) -> None:
    with pytest.raises(UnsupportedField) as info:
        render(tokenizer, TEMPLATE, template_kwargs={key: 1})
    assert info.value.param == f"chat_template_kwargs.{key}" and info.value.status == 400


def test_thinking_goes_by_the_name_the_template_reads(tokenizer) -> None:
    assert thinking_kwarg(DEEPSEEK) == "thinking"
    assert thinking_kwarg("{% if enable_thinking %}{% endif %}{{ thinking }}") == "enable_thinking"
    assert thinking_kwarg("{{ message.thinking }}{% if 'thinking' in m %}{% endif %}") == \
        "enable_thinking"   # gpt-oss reads a message's thinking, not a switch
    assert render(tokenizer, DEEPSEEK, thinking=True).endswith("<A><think>")
    assert render(tokenizer, DEEPSEEK, thinking=False).endswith("<A></think>")
    assert render(tokenizer, DEEPSEEK, template_kwargs={"thinking": True}).endswith("<think>")


def test_reasoning_effort_reaches_a_template_that_reads_it(tokenizer) -> None:
    assert render(tokenizer, GPT_OSS) == "Reasoning: medium|hi"
    assert render(tokenizer, GPT_OSS, reasoning_effort="high") == "Reasoning: high|hi"
    assert render(tokenizer, GPT_OSS, reasoning_effort="minimal") == "Reasoning: medium|hi"
    assert render(tokenizer, GPT_OSS, reasoning_effort="low",
                  template_kwargs={"reasoning_effort": "high"}) == "Reasoning: high|hi"
    assert render(tokenizer, TEMPLATE, reasoning_effort="high") == "hi<|endoftext|>"


def test_unparsable_template_reads_nothing() -> None:
    assert template_variables("{% if %}") == frozenset()
    assert "preserve_thinking" in template_variables(TEMPLATE)
