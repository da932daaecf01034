"""The protocol-neutral request every adapter translates its wire format into.

Adapters (OpenAI chat/completions/responses, Anthropic messages, llama.cpp
/completion) decode their own wire structs and produce one `GenRequest`; the
daemon renders it to token ids (core/prompt.py) and hands the engine a
`engine.types.SeqRequest`. Nothing here knows about HTTP or MLX.

Rules:
1. `None` means "the client did not say"; the daemon applies the model's
   defaults (models.toml `[sampling]`) and then its own.
2. A field the client sent that the daemon cannot honour is refused by the
   adapter with `UnsupportedField` -- never dropped here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .images import ImageRef

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(slots=True)
class SamplingParams:
    """Per-row sampling knobs. temperature 0 = greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_context_size: int = 64
    logit_bias: dict[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(slots=True)
class ToolCall:
    """A call the assistant made (in history) or makes (in output)."""

    id: str
    name: str
    arguments: str  # JSON text, as every protocol carries it


@dataclass(slots=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None   # role == "tool": which call this answers
    name: str | None = None           # role == "tool": the tool's name, when known
    reasoning: str | None = None      # assistant's earlier reasoning, if the client sent it back
    images: list[ImageRef] = field(default_factory=list)  # core/images.py rule 1


@dataclass(frozen=True, slots=True)
class ToolGrammar:
    """A custom tool's input grammar (Responses `custom` tools' `format`, core/custom_calls.py).

    The tool is offered as a function of one string argument, `argument`; the
    grammar constrains that string's text."""

    syntax: Literal["lark", "regex"]
    definition: str
    param: str               # the request field it came from, e.g. "tools[3].format.definition"
    argument: str = "input"


@dataclass(slots=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False   # arguments must match `parameters` (core/structured.py rule 6)
    grammar: ToolGrammar | None = None   # a custom tool's input grammar


ToolChoice = Literal["auto", "none", "required"] | str  # a str other than the three = that function's name


@dataclass(slots=True)
class ResponseFormat:
    """Structured-output constraint for one request (issue: structured output).

    kind: "json_object" (any JSON object), "json_schema" (`schema`),
    "grammar" (`grammar`, GBNF text), "regex" (`pattern`).
    """

    kind: Literal["json_object", "json_schema", "grammar", "regex"]
    schema: dict[str, Any] | None = None
    grammar: str | None = None
    pattern: str | None = None
    strict: bool = False
    name: str | None = None
    param: str | None = None   # the request field it came from (for 400s), e.g. "text.format"


@dataclass(slots=True)
class GenRequest:
    """One generation request, protocol-neutral.

    Exactly one of `messages` (chat: rendered with the chat template) or
    `prompt` (raw text or token ids, tokenized as is) is set.
    """

    model: str
    messages: list[Message] | None = None
    prompt: str | list[int | str] | None = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True       # False: the parser drops calls after the first
    max_tokens: int | None = None          # None = up to the context ceiling
    stop: list[str] = field(default_factory=list)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    stream: bool = False
    echo: bool = False                     # completions: return the prompt too
    cache_prompt: bool = True              # llama.cpp: False bypasses the prefix cache
    cache_salt: str | None = None
    speculative: bool = True               # False: no speculative drafts (engine/speculative/)
    thinking: bool | None = None           # None = the template's default
    reasoning_effort: str | None = None    # the client's effort word (core/template_kwargs.py rule 5)
    # chat_template_kwargs other than enable_thinking: passed where the template
    # reads them, refused by name where it does not (core/template_kwargs.py rule 1)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    thinking_budget_tokens: int | None = None
    response_format: ResponseFormat | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = True        # raw prompts: prepend BOS as the tokenizer does
    ignore_eos: bool = False
    # llama-server's t_max_predict_ms: once a newline is out and this many ms have passed
    # since the first token, the choice ends as if its length limit came (core/output.py)
    max_predict_ms: float | None = None
    min_indent: int | None = None   # llama-server's n_indent (core/output.py rule 9)
    request_id: str = ""
    user: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # adapter-specific, documented per adapter
    # The image parts of this request's own messages, in order (core/images.py rule 1).
    images: list[ImageRef] = field(default_factory=list)
    # Names of the `sampling` fields the client actually sent (None = unknown:
    # a field still at its SamplingParams default counts as unsent). Lets the
    # daemon apply models.toml [sampling] defaults only where the client was silent.
    sampling_sent: frozenset[str] | None = None
    # Neutral field name -> what this protocol calls it, where they differ
    # (llama.cpp: {"repetition_penalty": "repeat_penalty"}): core/checks.py's
    # refusals name the field the client actually sent.
    param_names: dict[str, str] = field(default_factory=dict)
