"""Test-only: a scripted engine and a tools-aware tiny checkpoint for adapter tests.

A tiny random-weight model cannot be made to emit `<tool_call>` JSON or a
`<think>` block reliably, so `ScriptedEngine` stands in for the engine of one
registry entry: it decodes the prompt it was given, asks a script function
what the "model" says, and streams that text back as real token ids of the
checkpoint's tokenizer. Everything downstream -- incremental detokenizing,
stop matching, the markup parsers, the adapters' frames, the SDK clients -- is
the production path. The prompts it saw are kept for assertions (e.g. that a
tool result reached the rendered prompt).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Callable

from frink_mlx.engine.types import EngineStats, SeqRequest, StepOutput

# Qwen-style: mlx-lm detects "json_tools" from "<tool_call>" + "tool_call.name".
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    "Reply with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>{{ message.content }}"
    "</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    "{{ message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "<tool_call>{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}"
    "</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

# Qwen3-style: the generation prompt opens the think block unless thinking is off.
THINK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)

# gpt-oss's Harmony layout (openai/gpt-oss's template, cut down): the generation
# prompt is `<|start|>assistant`, so the reply starts inside a message header.
HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>")
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}\n"
    "# Valid channels: analysis, commentary, final.<|end|>"
    "{%- if tools %}<|start|>developer<|message|># Tools\nnamespace functions {\n"
    "{%- for t in tools %}type {{ t.function.name }} = (_: any) => any;\n{% endfor %}"
    "} // namespace functions<|end|>{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|start|>functions.{{ m.name or 'tool' }} to=assistant"
    "<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls %}{%- for c in m.tool_calls %}"
    "<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} <|constrain|>json"
    "<|message|>{{ c.function.arguments | tojson }}<|call|>{%- endfor %}"
    "{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>"
    "{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start|>assistant{%- endif %}"
)

Script = Callable[[str], str]


def add_think_tokens(checkpoint: Path) -> Path:
    """Give a tiny checkpoint's tokenizer `<think>`/`</think>` as single tokens
    (mlx-lm then detects the thinking markers exactly as it does for Qwen3)."""
    return add_tokens(checkpoint, ("<think>", "</think>"))


def add_tokens(checkpoint: Path, texts: tuple[str, ...]) -> Path:
    """Add `texts` to a tiny checkpoint's tokenizer as single tokens.

    They get ids past the model's embedding rows, which is fine for a
    ScriptedEngine: it never runs the model.
    """
    path = checkpoint / "tokenizer.json"
    tok = json.loads(path.read_text())
    next_id = max([*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]) + 1
    for i, text in enumerate(texts):
        tok["added_tokens"].append({"id": next_id + i, "content": text, "single_word": False,
                                    "lstrip": False, "rstrip": False, "normalized": False,
                                    "special": False})
    path.write_text(json.dumps(tok))
    return checkpoint


class _Stream:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[StepOutput | None] = asyncio.Queue()
        self.aborted = False

    def abort(self, index: int | None = None) -> None:
        if index is None:  # one row's abort (a stop string): its tokens are just dropped
            self.aborted = True

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> StepOutput:
        if self.aborted:
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


class ScriptedEngine:
    """Engine API (submit/stats/shutdown/start) answering from `script(prompt_text)`."""

    def __init__(self, loaded: Any, script: Script) -> None:
        self.tokenizer = loaded.tokenizer
        self.context_length = loaded.context_length
        self.script = script
        self.seen: list[tuple[SeqRequest, str]] = []

    def start(self) -> None:
        pass

    def submit(self, seq: SeqRequest) -> _Stream:
        prompt = self.tokenizer.decode(seq.prompt_ids, skip_special_tokens=False)
        self.seen.append((seq, prompt))
        ids = list(self.tokenizer.encode(self.script(prompt), add_special_tokens=False))
        eos = sorted(seq.stop_token_ids)
        stream = _Stream()
        for row in range(seq.n):  # every row says the same
            for i, tok in enumerate(ids[: seq.max_tokens]):
                last = i + 1 == seq.max_tokens
                stream.queue.put_nowait(StepOutput(
                    row, tok, logprob=0.0, finish="length" if last else None,
                    num_prompt_tokens=len(seq.prompt_ids) if i == 0 else None,
                    num_cached_tokens=0 if i == 0 else None))
            if len(ids) < seq.max_tokens:
                stream.queue.put_nowait(StepOutput(
                    row, eos[0] if eos else None, finish="eos",
                    num_prompt_tokens=len(seq.prompt_ids) if not ids else None,
                    num_cached_tokens=0 if not ids else None))
        stream.queue.put_nowait(None)
        return stream

    def stats(self) -> EngineStats:
        return EngineStats(context_ceiling=self.context_length)

    def shutdown(self, timeout_s: float) -> None:
        pass


def mixed_factory(scripts: dict[str, Script], engines: dict[str, ScriptedEngine]) -> Any:
    """Registry entries named in `scripts` get a ScriptedEngine; the rest the real engine."""
    from daemon_support import generation_factory

    from frink_mlx.models.loader import load_model
    from frink_mlx.serving.generation import Generation

    real = generation_factory()

    def factory(spec: Any, settings: Any, number: int, gate: Any, backend: Any) -> Any:
        if spec.name not in scripts:
            return real(spec, settings, number, gate, backend)
        loaded = load_model(spec, settings.load, backend)
        engine = engines[spec.name] = ScriptedEngine(loaded, scripts[spec.name])
        return Generation(number, spec, loaded, engine, None, time.monotonic())

    return factory


def write_models_toml(tmp: Path, entries: dict[str, Path], default: str) -> Path:
    lines = [f'default = "{default}"', ""]
    for name, source in entries.items():
        lines += [f"[models.{name}]", f'source = "{source}"', ""]
    path = tmp / "models.toml"
    path.write_text("\n".join(lines))
    return path
