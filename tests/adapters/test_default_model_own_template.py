"""SmolLM2 with its OWN chat template (which ignores `tools`) still gets tool calls.

core/prompt.py rule 6 adds the Hermes tools block and the parser expects Hermes
`<tool_call>` markup, so a forced call (grammar-constrained) comes back as a real
tool call with no registry template override (compare test_default_model.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def smol(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from daemon_support import generation_factory, start_server

    root = tmp_path_factory.mktemp("smol_own")
    (root / "models.toml").write_text(
        f'default = "smol"\n\n[models.smol]\nsource = "{smollm2_gguf_path}"\n')
    settings = Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                             access_log=False, cache_dir=str(root / "cache"))
    server = start_server(create_app(settings, registry=load_registry(settings),
                                     factory=generation_factory()))
    yield server
    server.stop()


def test_forced_call_with_the_models_own_template(smol: Any) -> None:
    client = openai.OpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0, timeout=120)
    resp = client.chat.completions.create(
        model="smol", max_tokens=60, temperature=0, tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert "<tool_call>" not in (choice.message.content or "")
    assert (resp.usage.prompt_tokens or 0) > 60   # the tools block is in the prompt
