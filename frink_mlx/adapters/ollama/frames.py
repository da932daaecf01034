"""Ollama's answer: events -> NDJSON frames (stream) or one body (collected).

The package's `FrameBuilder` (adapters/endpoint.py rule 7) is `AnswerBuilder`,
for /api/chat and /api/generate alike.

Rules:
1. Durations are nanoseconds: `total_duration` from the request's start to
   its end; `load_duration` the time spent getting the model ready and the
   prompt admitted (a swap's load included); `prompt_eval_duration` the time to
   the first token; `eval_duration` the rest.
2. `prompt_eval_count` counts the prompt tokens evaluated, i.e. not read from
   the prefix cache (as Ollama reports them); `eval_count` the generated tokens.
3. `done_reason`: "length" when the token limit ended it, else "stop" (tool
   calls included, as Ollama does).
4. Tool calls are sent whole, once each is complete (Ollama does not stream
   arguments); an engine failure mid-stream is one `{"error": ...}` line.
5. Arguments that are not a JSON object (a call cut by the token limit) stay
   in `content` as text, as Ollama leaves markup it cannot parse.
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass, field
from typing import Any

from ...core.events import Done, ErrorEvent, Event, ReasoningDelta, TextDelta, ToolCallEnd, ToolCallStart


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class Clock:
    """Rule 1's reference points (perf_counter_ns)."""

    started_ns: int
    load_ns: int = 0

    @classmethod
    def start(cls) -> Clock:
        return cls(time.perf_counter_ns())

    def loaded(self) -> None:
        self.load_ns = time.perf_counter_ns() - self.started_ns


def final_fields(done: Done, clock: Clock) -> dict[str, Any]:
    """Rules 1-3: the fields of the frame that ends an answer."""
    usage = done.usage
    prompt_ns = int(float(done.timings.get("prompt_ms", 0.0)) * 1e6)
    eval_ns = int(float(done.timings.get("predicted_ms", 0.0)) * 1e6)
    return {"done": True, "done_reason": "length" if done.finish_reason == "length" else "stop",
            "total_duration": time.perf_counter_ns() - clock.started_ns,
            "load_duration": clock.load_ns,
            "prompt_eval_count": usage.prompt_tokens - usage.cached_tokens,
            "prompt_eval_duration": prompt_ns, "eval_count": usage.completion_tokens,
            "eval_duration": eval_ns}


@dataclass(slots=True)
class AnswerBuilder:
    """Events -> Ollama frames (stream) or one body (collected); chat or generate."""

    model: str
    chat: bool
    clock: Clock
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)
    done: dict[str, Any] | None = None

    def _frame(self, content: str = "", thinking: str = "",
               calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        frame: dict[str, Any] = {"model": self.model, "created_at": now_rfc3339()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            frame["message"] = message
        else:
            frame["response"] = content
            if thinking:
                frame["thinking"] = thinking
        return frame

    def start(self) -> list[dict[str, Any]]:
        return []

    def feed(self, event: Event) -> list[dict[str, Any]]:
        """Frames for one event (rule 4); the final frame carries final_fields."""
        if isinstance(event, TextDelta):
            self.text.append(event.text)
            return [{**self._frame(content=event.text), "done": False}]
        if isinstance(event, ReasoningDelta):
            self.thinking.append(event.text)
            return [{**self._frame(thinking=event.text), "done": False}]
        if isinstance(event, ToolCallStart):
            self.names[event.call_index] = event.name
            return []
        if isinstance(event, ToolCallEnd):
            return self._call(event)
        if isinstance(event, Done):
            self.done = final_fields(event, self.clock)
            return [{**self._frame(), **self.done}]
        if isinstance(event, ErrorEvent):
            return [{"error": event.message}]
        return []

    def _call(self, event: ToolCallEnd) -> list[dict[str, Any]]:
        """Rule 5: a call whose arguments are not a JSON object stays text."""
        try:
            arguments = json.loads(event.arguments or "{}")
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            self.text.append(event.arguments)
            return [{**self._frame(content=event.arguments), "done": False}]
        call = {"id": f"call_{event.call_index}",
                "function": {"index": event.call_index,
                             "name": self.names.get(event.call_index, ""),
                             "arguments": arguments}}
        self.calls.append(call)
        return [{**self._frame(calls=[call]), "done": False}]

    def end(self) -> list[dict[str, Any]]:
        return []

    def result(self) -> dict[str, Any]:
        """The collected answer (the non-streaming body)."""
        frame = self._frame("".join(self.text), "".join(self.thinking), self.calls)
        return {**frame, **(self.done or {"done": True})}
