"""What some families' own chat templates need from the messages that others do not.

Rules:
1. Arguments as text: a template that joins an earlier call's arguments into
   its text with `+` (DeepSeek-V3.1's official one: `'<｜tool▁sep｜>' +
   tool['function']['arguments'] + ...`) gets them as the JSON text the client
   sent; a dict there is a Jinja error. Every other template gets the parsed
   object (the HF convention, which `|tojson` and `.items()` expect).
2. Tools the template never renders: where the model's family has a tools
   block of its own (DeepSeek-V3.1's, from its model card), that block joins
   the system message and earlier calls stay for the template to render in
   the family's markup, so the family's parser still applies. Other families
   get the Hermes block (prompt.py rule 6).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from .request import Tool

_ARGUMENTS = r"""(?:\[['"]arguments['"]\]|\.arguments)"""
_JOINED_ARGUMENTS = re.compile(  # `arguments +` or `+ ...arguments` not followed by a filter
    rf"""{_ARGUMENTS}\s*\+|\+\s*[\w.\[\]'"]*{_ARGUMENTS}(?!\s*\|)""")


def arguments_as_text(source: str | None) -> bool:
    """Rule 1: whether the template joins an earlier call's arguments into text with `+`
    (then it gets the client's JSON text, not the parsed object)."""
    return bool(source) and bool(_JOINED_ARGUMENTS.search(source or ""))


def deepseek_tools_block(tools: list[Tool]) -> str:
    """DeepSeek-V3.1's tool instructions, as its model card writes them."""
    described = "".join(
        f"### {t.name}\nDescription: {t.description}\n\n"
        f"Parameters: {json.dumps(t.parameters, ensure_ascii=False)}\n\n" for t in tools)
    return (
        "## Tools\nYou have access to the following tools:\n\n" + described +
        "IMPORTANT: ALWAYS adhere to this exact format for tool use:\n"
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>"
        "tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\n\n"
        "Where:\n- `tool_call_name` must be an exact match to one of the available tools\n"
        "- `tool_call_arguments` must be valid JSON that strictly follows the tool's "
        "Parameters Schema\n"
        "- For multiple tool calls, chain them directly without separators or spaces")


FAMILY_TOOL_BLOCKS: dict[str, Callable[[list[Tool]], str]] = {
    "deepseek_v31": deepseek_tools_block,
}
