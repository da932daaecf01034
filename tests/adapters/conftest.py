"""One live daemon (uvicorn on a free port) shared by the adapter HTTP tests.

Registry: `tiny` -- the shared tiny llama on the real engine (real decoding);
`scripted` -- a tools-aware copy of it whose engine is `ScriptedEngine`
(scripted.py), answering by `SCRIPT` below so tool calls and reasoning come
out as the markup a real model would write; `thinker` -- a copy with
`<think>` tokens and a Qwen3-style template that opens the think block in the
prompt, answering by `THINKER`; `coder` -- a copy with Qwen2.5-Coder's
fill-in-the-middle tokens, always answering "a, b"; `structured` -- a tools-aware
copy answering `{"city": "Paris"}` (as a call of the first offered tool when
tools are offered), by `STRUCTURED`.

`vlive` is a second daemon for the image tests (test_vision_*.py): `vlm` (the default), a
tiny random Gemma 3 VLM, `qvlm` a Qwen2.5-VL (tests/vision_support.py), and `tiny`, text only.
"""

from __future__ import annotations

from typing import Any

import pytest

from adapters.scripted import (
    HARMONY_TEMPLATE,
    HARMONY_TOKENS,
    THINK_TEMPLATE,
    TOOLS_TEMPLATE,
    ScriptedEngine,
    add_think_tokens,
    add_tokens,
    mixed_factory,
    write_models_toml,
)
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>")

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def SCRIPT(prompt: str) -> str:
    """What the scripted model 'says', given its rendered prompt."""
    last_user = prompt.rsplit("<|im_start|>user\n", 1)[-1]
    if "<tool_response>" in last_user:
        return "The weather in Paris is 18C."
    if "please patch" in last_user:  # a custom tool (Responses): its one string input
        return '<tool_call>{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}</tool_call>'
    if "forbidden" in last_user:
        return 'Sure.<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    if "<tools>" in prompt:
        return "<think>The user wants the weather.</think>\n" + TOOL_CALL
    if "think" in last_user:
        return "<think>Let me think.</think>\n\nDone thinking."
    return "Hello from the script."


def STRUCTURED(prompt: str) -> str:
    """Answers every request with {"city": "Paris"}: as a call of the first offered tool
    when tools are offered (LangChain's function_calling), else as bare JSON."""
    if "<tools>" in prompt:
        name = prompt.split("<tools>", 1)[1].split('"name": "', 1)[1].split('"', 1)[0]
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"city": "Paris"}}}}\n</tool_call>'
    return '{"city": "Paris"}'


def THINKER(prompt: str) -> str:
    """A Qwen3-like model: continues a think block its prompt opened."""
    if prompt.rstrip().endswith("<think>"):
        return "Reasoning here.</think>\n\nAnswer."
    return "Answer."


HARMONY_CALL = ("<|channel|>analysis<|message|>The user wants the weather.<|end|>"
                "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
                '<|message|>{"city": "Paris"}<|call|>')


def HARMONY(prompt: str) -> str:
    """A gpt-oss-like model: analysis, then a call in commentary or the answer in final."""
    last = prompt.rsplit("<|start|>user<|message|>", 1)[-1]
    if "<|start|>functions." in last:
        return "<|channel|>final<|message|>The weather in Paris is 18C.<|return|>"
    if "namespace functions" in prompt:
        return HARMONY_CALL
    return ("<|channel|>analysis<|message|>Simple question.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>")


@pytest.fixture(scope="session")
def adapter_engines() -> dict[str, ScriptedEngine]:
    return {}


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory, adapter_engines: dict[str, Any]) -> Any:
    from conftest import make_tiny_llama
    from daemon_support import start_server

    root = tmp_path_factory.mktemp("adapters")
    tiny = make_tiny_llama(root / "tiny")
    scripted = make_tiny_llama(root / "scripted", chat_template=TOOLS_TEMPLATE)
    thinker = add_think_tokens(make_tiny_llama(root / "thinker", chat_template=THINK_TEMPLATE))
    coder = add_tokens(make_tiny_llama(root / "coder"), FIM_TOKENS)
    structured = make_tiny_llama(root / "structured", chat_template=TOOLS_TEMPLATE)
    gptoss = add_tokens(make_tiny_llama(root / "gptoss", chat_template=HARMONY_TEMPLATE),
                        HARMONY_TOKENS)
    path = write_models_toml(root, {"tiny": tiny, "scripted": scripted, "thinker": thinker,
                                    "coder": coder, "structured": structured,
                                    "gptoss": gptoss}, default="tiny")
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"), fallback=False)
    app = create_app(settings, registry=load_registry(settings),
                     factory=mixed_factory({"scripted": SCRIPT, "thinker": THINKER,
                                             "structured": STRUCTURED, "gptoss": HARMONY,
                                             "coder": lambda prompt: "a, b"},
                                            adapter_engines))
    server = start_server(app)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vlive(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import make_tiny_llama
    from daemon_support import start_server
    from vision_support import make_tiny_gemma3_vlm, make_tiny_qwen2_5_vl

    root = tmp_path_factory.mktemp("vision")
    vlm = make_tiny_gemma3_vlm(root / "vlm")
    qvlm = make_tiny_qwen2_5_vl(root / "qvlm")
    path = write_models_toml(root, {"vlm": vlm, "qvlm": qvlm,
                                    "tiny": make_tiny_llama(root / "tiny")}, default="vlm")
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"), fallback=False, max_images=8)
    server = start_server(create_app(settings, registry=load_registry(settings)))
    server.vlm_path = vlm
    server.qvlm_path = qvlm
    yield server
    server.stop()
