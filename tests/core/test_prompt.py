"""core/prompt.py: chat templates, raw prompts, token-id prompts, errors naming the field."""

from __future__ import annotations

import pytest

from frink_mlx.core.prompt import render_prompt
from frink_mlx.core.request import GenRequest, Message, Tool, ToolCall
from frink_mlx.errors import InvalidRequest


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_llama_dir)


def test_chat_renders_with_template_like_mlx_lm(tokenizer):
    msgs = [Message("system", "Be brief."), Message("user", "Hello there")]
    out = render_prompt(tokenizer, GenRequest(model="m", messages=msgs))
    expected = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        add_generation_prompt=True)
    assert out.ids == list(expected)
    assert out.text.endswith("<|im_start|>assistant\n")


def test_tool_history_reaches_the_template(tokenizer):
    template = ("{% for m in messages %}{{ m.role }}:{{ m.content }}"
                "{% for c in m.tool_calls or [] %}[{{ c.function.name }} {{ c.function.arguments.x }}]"
                "{% endfor %}|{% endfor %}{% for t in tools or [] %}T={{ t.function.name }}{% endfor %}")
    msgs = [Message("user", "go"),
            Message("assistant", "", tool_calls=[ToolCall("c1", "f", '{"x": 5}')]),
            Message("tool", "ok", tool_call_id="c1")]
    out = render_prompt(tokenizer, GenRequest(model="m", messages=msgs, tools=[Tool("f")]),
                        template=template)
    assert out.text == "user:go|assistant:[f 5]|tool:ok|T=f"


def test_template_error_is_400_naming_messages(tokenizer):
    bad = "{{ raise_exception('no system role') }}"
    with pytest.raises(InvalidRequest) as info:
        render_prompt(tokenizer, GenRequest(model="m", messages=[Message("user", "x")]),
                      template=bad)
    assert info.value.param == "messages" and "no system role" in info.value.message


def test_empty_messages_refused(tokenizer):
    with pytest.raises(InvalidRequest) as info:
        render_prompt(tokenizer, GenRequest(model="m", messages=[]))
    assert info.value.param == "messages"


def test_raw_prompt_and_token_ids(tokenizer):
    out = render_prompt(tokenizer, GenRequest(model="m", prompt="Hello world"))
    assert out.ids == tokenizer.encode("Hello world")
    ids = render_prompt(tokenizer, GenRequest(model="m", prompt=[5, 6, 7])).ids
    assert ids == [5, 6, 7]


def test_bad_token_ids_name_prompt(tokenizer):
    for bad in ([1, 10**9], [1, "x"], []):
        with pytest.raises(InvalidRequest) as info:
            render_prompt(tokenizer, GenRequest(model="m", prompt=bad))
        assert info.value.param == "prompt"
