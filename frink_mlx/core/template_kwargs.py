"""Which of a request's template variables reach the chat template.

Why: families put switches in their templates (Qwen3.6's `preserve_thinking`,
GLM-4.7's `clear_thinking`, gpt-oss's `reasoning_effort`, DeepSeek-V3.1's
`thinking`) and clients send them as vLLM's `chat_template_kwargs`. Passing a
key the template never reads would silently change nothing, so such a key is
refused by name, as any field that cannot be honoured is.

Rules:
1. A client key (`chat_template_kwargs.KEY`) is passed when the template
   source reads a variable of that name that it does not set itself
   (jinja2's `meta.find_undeclared_variables`, with HF's `{% generation %}` tag
   understood). Anything else is refused: 400 `unsupported_field` naming
   `chat_template_kwargs.KEY`.
2. Names the daemon sets itself (`messages`, `tools`, `add_generation_prompt`,
   ...), the tokenizer's special tokens (`*_token`) and HF's helpers
   (`raise_exception`, `strftime_now`) are refused even where the template
   reads them: they are not the client's to replace.
3. A template with no source (mlx-lm's Python renderers) or one that does not
   parse reads no client keys (its render reports its own errors).
4. The request's thinking switch goes as `enable_thinking`, or as `thinking`
   where the template reads a bare `thinking` and never `enable_thinking`
   (DeepSeek-V3.1's template).
5. The request's `reasoning_effort` (low / medium / high) goes as
   `reasoning_effort` where the template reads it (gpt-oss's "Reasoning:"
   line), unless the client set that key itself.
"""

from __future__ import annotations

import re
from typing import Any

from jinja2 import TemplateSyntaxError, meta, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import UnsupportedField

RESERVED = frozenset({
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "chat_template", "tokenize", "return_dict", "raise_exception", "strftime_now",
})
EFFORTS = frozenset({"low", "medium", "high"})

_ENABLE_THINKING = re.compile(r"\benable_thinking\b")
_BARE_THINKING = re.compile(r"(?<![\w.'\"])thinking\b(?!\s*['\"\]])")
_REASONING_EFFORT = re.compile(r"\breasoning_effort\b")


def template_source(tokenizer: Any, template: str | None) -> str | None:
    """The chat template in use as text (HF's named templates joined), or None."""
    source = template if template is not None else getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):   # HF's named templates ("default", "tool_use")
        source = "\n".join(str(v) for v in source.values())
    return source if isinstance(source, str) else None


class _Generation(Extension):
    """HF's `{% generation %}...{% endgeneration %}` (marks assistant turns): its body, as is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def template_variables(source: str) -> frozenset[str]:
    """Rule 1: the variables `source` reads without setting them ({} when it does not parse)."""
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols", _Generation])
    try:
        return frozenset(meta.find_undeclared_variables(env.parse(source)))
    except TemplateSyntaxError:
        return frozenset()


def client_kwargs(kwargs: dict[str, Any], source: str | None) -> dict[str, Any]:
    """Rules 1-3: the client's keys, checked against what the template reads."""
    if not kwargs:
        return {}
    readable = template_variables(source) if source else frozenset()
    for key in kwargs:
        if key in RESERVED or key.endswith("_token"):
            raise UnsupportedField(f"chat_template_kwargs.{key}",
                                   "is set by the server and cannot be replaced")
        if key not in readable:
            raise UnsupportedField(f"chat_template_kwargs.{key}",
                                   "is not read by this model's chat template")
    return dict(kwargs)


def thinking_kwarg(source: str | None) -> str:
    """Rule 4: the name the template reads its thinking switch by."""
    if source and not _ENABLE_THINKING.search(source) and _BARE_THINKING.search(source):
        return "thinking"
    return "enable_thinking"


def effort_kwargs(effort: str | None, source: str | None) -> dict[str, Any]:
    """Rule 5: `reasoning_effort` for a template that reads it, unless the client set it."""
    if effort in EFFORTS and source and _REASONING_EFFORT.search(source):
        return {"reasoning_effort": effort}
    return {}
