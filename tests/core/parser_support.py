"""Test-only: feed a stream parser whole, one character at a time and split at every point.

A parser must give the same events however the text is chunked (the
detokenizer releases text in arbitrary pieces); `every_split` checks that and
returns the merged events for the assertions.
"""

from __future__ import annotations

from frink_mlx.core.events import Event, ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEnd, ToolCallStart
from frink_mlx.core.parsers import MarkupInfo, build_parser
from frink_mlx.core.request import GenRequest, Message, Tool


def chat(*tools: str | Tool, tool_choice: str = "auto", parallel: bool = True) -> GenRequest:
    return GenRequest(model="m", messages=[Message("user", "hi")],
                      tools=[t if isinstance(t, Tool) else Tool(t) for t in tools],
                      tool_choice=tool_choice, parallel_tool_calls=parallel)


def run(markup: MarkupInfo, req: GenRequest, chunks: list[str]) -> tuple[list[Event], bool]:
    parser = build_parser(markup, req)
    events: list[Event] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish()
    return events, parser.saw_tool_call


def merged(events: list[Event]) -> list[tuple]:
    """Adjacent text/reasoning/argument deltas merged; call ids checked and dropped."""
    out: list[tuple] = []
    for ev in events:
        if isinstance(ev, (TextDelta, ReasoningDelta)):
            kind = "text" if isinstance(ev, TextDelta) else "reasoning"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + ev.text)
            else:
                out.append((kind, ev.text))
        elif isinstance(ev, ToolCallStart):
            assert ev.id.startswith("call_")
            out.append(("start", ev.call_index, ev.name))
        elif isinstance(ev, ToolCallDelta):
            if out and out[-1][0] == "args" and out[-1][1] == ev.call_index:
                out[-1] = ("args", ev.call_index, out[-1][2] + ev.arguments)
            else:
                out.append(("args", ev.call_index, ev.arguments))
        elif isinstance(ev, ToolCallEnd):
            out.append(("end", ev.call_index, ev.arguments))
    return out


def every_split(markup: MarkupInfo, req: GenRequest, text: str) -> list[tuple]:
    """The merged events of `text`, the same whole, per character and cut at every point."""
    whole, saw = run(markup, req, [text])
    expected = merged(whole)
    ways = [list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for chunks in ways:
        events, saw_again = run(markup, req, chunks)
        assert merged(events) == expected, chunks
        assert saw_again == saw
        ends = {e.call_index: e.arguments for e in events if isinstance(e, ToolCallEnd)}
        for call_index, arguments in ends.items():   # deltas add up to the end's arguments
            sent = "".join(e.arguments for e in events
                           if isinstance(e, ToolCallDelta) and e.call_index == call_index)
            assert sent == arguments
    return expected


def call(index: int, name: str, arguments: str) -> list[tuple]:
    return [("start", index, name), ("args", index, arguments), ("end", index, arguments)]
