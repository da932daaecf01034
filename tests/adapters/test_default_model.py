"""Tool calls with the real default model (SmolLM2-135M-Instruct from its GGUF).

SmolLM2's own template ignores `tools`, so the registry entry here overrides it
with the tools-aware template of scripted.py (models.toml's `chat_template`);
mlx-lm then detects the Hermes `<tool_call>` format from it. A forced call
(`tool_choice`) is grammar-constrained, so the 135M model must produce a
well-formed call, which the parser turns into a real `tool_use` block; an
unforced reply may be anything, but never carries markup as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from adapters.scripted import TOOLS_TEMPLATE
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

pytestmark = pytest.mark.slow

WEATHER_TOOL = {"name": "get_weather", "description": "Current weather for a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}


@pytest.fixture(scope="module")
def smol(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from daemon_support import generation_factory, start_server

    root = tmp_path_factory.mktemp("smol")
    (root / "models.toml").write_text(
        'default = "smol"\n\n[models.smol]\n'
        f'source = "{smollm2_gguf_path}"\n'
        f"chat_template = '''{TOOLS_TEMPLATE}'''\n")
    settings = Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                             access_log=False, cache_dir=str(root / "cache"))
    server = start_server(create_app(settings, registry=load_registry(settings),
                                     factory=generation_factory()))
    yield server
    server.stop()


def test_forced_tool_call_is_parsed_into_tool_use(smol: Any) -> None:
    client = anthropic.Anthropic(base_url=smol.url, api_key="x", max_retries=0, timeout=120)
    message = client.messages.create(
        model="smol", max_tokens=60, tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        extra_body={"temperature": 0})  # greedy: a sampled city name can run past the cap
    assert message.stop_reason == "tool_use"
    calls = [b for b in message.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(calls[0].input.get("city"), str)
    assert all("<tool_call>" not in b.text for b in message.content if b.type == "text")


def test_forced_function_call_in_responses_and_no_markup_leak(smol: Any) -> None:
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0, timeout=120)
    tool = {"type": "function", "name": "get_weather", "description": "Weather",
            "parameters": WEATHER_TOOL["input_schema"]}
    forced = client.responses.create(model="smol", input="Weather in Oslo?", tools=[tool],
                                     tool_choice="required", max_output_tokens=60)
    calls = [item for item in forced.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    free = client.responses.create(model="smol", input="Say hello.", tools=[tool],
                                   max_output_tokens=40, temperature=0)
    assert "<tool_call>" not in free.output_text and "</tool_call>" not in free.output_text
