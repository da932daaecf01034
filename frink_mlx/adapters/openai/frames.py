"""OpenAI chat and completions answers: events -> chunks (SSE) or one JSON body.

Every JSON goes through adapters/endpoint.py's `dumps` (endpoint.py rule 7).

Rules (chat):
1. A choice's role chunk (`{"role": "assistant", "content": null}`) goes out
   when its first real delta is ready, right before it -- as llama-server sends
   it -- not ahead of prompt processing: clients time prompt processing by the
   first chunk. A choice that ends without a delta gets its role chunk right
   before its finish chunk. Then content / reasoning / tool-call deltas (no
   `role`), a finish chunk per choice; with
   `stream_options.include_usage` one more chunk with empty `choices` and
   `usage`; then `data: [DONE]`. An engine failure mid-stream is one
   `data: {"error": ...}` frame, after which the stream ends (no [DONE]).
2. `usage.prompt_tokens` counts the prompt once (n > 1 prefills once);
   completion tokens are summed over choices; `prompt_tokens_details` carries
   `cached_tokens` and, when measured, the `prefix_divergence` extension and
   (with the SSD tier on) `disk_cached_tokens`, the cached tokens read back
   from disk;
   when the request speculated (engine/speculative/), the `draft_tokens` /
   `draft_accepted` extensions count drafted and accepted tokens.
3. Reasoning goes out as `reasoning_content` (the vLLM / DeepSeek field).
4. finish_reason "abort" (client gone, shutdown) is reported as "stop".
5. A one-choice answer carries llama-server's `timings` extension (prompt and
   decode counts, times, rates; adapters/llamacpp/frames.py rule 3): in the
   body, and in a stream on the finish chunk and the usage chunk -- where
   llama-server's web UI and benchmark clients read it. OpenAI clients ignore it.

Completions (completions.py rules 2-3): `echo` prepends the prompt's text, and
`logprobs` takes the legacy `{tokens, token_logprobs, top_logprobs, text_offset}`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator

from ...core.events import (
    Done,
    ErrorEvent,
    Event,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from ...http.errors import error_body
from ..endpoint import dumps, merged
from ..llamacpp.frames import timings

if TYPE_CHECKING:
    from ...serving.frontend import Frontend
    from ...serving.handles import Run


# --- shared response pieces ------------------------------------------------------

def finish_reason(done: Done) -> str:
    return "stop" if done.finish_reason in ("abort", "error") else done.finish_reason


@dataclass(slots=True)
class UsageSum:
    """Rule 2: prompt once, completion summed over choices."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    disk_cached_tokens: int | None = None  # extension: of cached_tokens, from the SSD tier
    prefix_divergence: int | None = None
    reasoning_tokens: int | None = None
    draft_tokens: int | None = None     # extension: speculative tokens drafted / accepted
    draft_accepted: int | None = None

    def add_done(self, done: Done) -> None:
        self.add(done.usage)

    def add(self, usage: Usage) -> None:
        self.prompt_tokens = usage.prompt_tokens
        self.cached_tokens = usage.cached_tokens
        self.disk_cached_tokens = usage.disk_cached_tokens
        self.completion_tokens += usage.completion_tokens
        if usage.prefix_divergence is not None:
            self.prefix_divergence = usage.prefix_divergence
        if usage.reasoning_tokens is not None:
            self.reasoning_tokens = (self.reasoning_tokens or 0) + usage.reasoning_tokens
        self.add_drafts(usage.draft_tokens, usage.draft_accepted)

    def add_drafts(self, drafted: int | None, accepted: int | None) -> None:
        if drafted is not None:
            self.draft_tokens = (self.draft_tokens or 0) + drafted
            self.draft_accepted = (self.draft_accepted or 0) + (accepted or 0)

    def as_dict(self) -> dict[str, Any]:
        details: dict[str, Any] = {"cached_tokens": self.cached_tokens}
        if self.disk_cached_tokens is not None:
            details["disk_cached_tokens"] = self.disk_cached_tokens
        if self.prefix_divergence is not None:
            details["prefix_divergence"] = self.prefix_divergence
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens,
                               "total_tokens": self.prompt_tokens + self.completion_tokens,
                               "prompt_tokens_details": details}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        if self.draft_tokens is not None:
            out["draft_tokens"] = self.draft_tokens
            out["draft_accepted"] = self.draft_accepted
        return out


def logprob_entry(lp: TokenLogprob) -> dict[str, Any]:
    return {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
            "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes}
                             for t in lp.top]}


# --- non-streaming ---------------------------------------------------------------

@dataclass(slots=True)
class ChoiceAcc:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    done: Done | None = None


def accumulate(acc: dict[int, ChoiceAcc], event: Event) -> None:
    c = acc.setdefault(event.index, ChoiceAcc())
    if isinstance(event, TextDelta):
        c.text.append(event.text)
        c.logprobs.extend(event.logprobs)
    elif isinstance(event, ReasoningDelta):
        c.reasoning.append(event.text)
    elif isinstance(event, ToolCallStart):
        c.calls[event.call_index] = {"id": event.id, "type": "function",
                                     "function": {"name": event.name, "arguments": ""}}
    elif isinstance(event, ToolCallEnd):
        c.calls[event.call_index]["function"]["arguments"] = event.arguments
    elif isinstance(event, Done):
        c.done = event


async def collect(run: Run) -> dict[int, ChoiceAcc]:
    acc: dict[int, ChoiceAcc] = {}
    async for event in run.events():
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        accumulate(acc, event)
    return acc


def chat_choice(index: int, c: ChoiceAcc, want_logprobs: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(c.text)}
    if c.reasoning:
        message["reasoning_content"] = "".join(c.reasoning)
    if c.calls:
        message["tool_calls"] = [c.calls[k] for k in sorted(c.calls)]
        message["content"] = message["content"] or None
    assert c.done is not None
    return {"index": index, "message": message, "finish_reason": finish_reason(c.done),
            "logprobs": {"content": [logprob_entry(lp) for lp in c.logprobs]}
            if want_logprobs else None}


def chat_body(run: Run, acc: dict[int, ChoiceAcc], want_logprobs: bool) -> dict[str, Any]:
    usage = UsageSum()
    for c in acc.values():
        if c.done is not None:
            usage.add_done(c.done)
    body = {"id": f"chatcmpl-{run.id}", "object": "chat.completion", "created": run.created,
            "model": run.model, "system_fingerprint": f"frink-g{run.generation}",
            "choices": [chat_choice(i, acc[i], want_logprobs) for i in sorted(acc)],
            "usage": usage.as_dict()}
    only = acc.get(0) if len(acc) == 1 else None
    if only is not None and only.done is not None:   # rule 5
        body["timings"] = timings(only.done)
    return body


# --- streaming -------------------------------------------------------------------

def _delta(event: Event) -> dict[str, Any] | None:
    if isinstance(event, TextDelta):
        return {"content": event.text}
    if isinstance(event, ReasoningDelta):
        return {"reasoning_content": event.text}
    if isinstance(event, ToolCallStart):
        return {"tool_calls": [{"index": event.call_index, "id": event.id, "type": "function",
                                "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ToolCallDelta):
        return {"tool_calls": [{"index": event.call_index,
                                "function": {"arguments": event.arguments}}]}
    return None


class ChatBuilder:
    """One chat answer, every choice of its run: chunk payloads as events come (rules
    1-5), and the collected body (`result`) -- the package's FrameBuilder
    (adapters/endpoint.py rule 7)."""

    def __init__(self, run: Run, include_usage: bool, want_logprobs: bool,
                 n_choices: int = 1) -> None:
        self.run, self.include_usage, self.want_logprobs = run, include_usage, want_logprobs
        self.n_choices = n_choices
        self.head = {"id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk",
                     "created": run.created, "model": run.model,
                     "system_fingerprint": f"frink-g{run.generation}"}
        self.started: set[int] = set()   # rule 1: choices whose role went out
        self.usage = UsageSum()
        self.ends: list[Done] = []
        self.acc: dict[int, ChoiceAcc] = {}
        self.failed = False              # rule 1: an error frame ends the stream

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None,
               logprobs: Any = None, **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**self.head, "choices": [choice], **extra}

    def start(self) -> list[dict[str, Any]]:
        return []   # rule 1: nothing ahead of prompt processing

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, ErrorEvent):
            self.failed = True
            return [error_body(event.to_error())]
        accumulate(self.acc, event)
        out: list[dict[str, Any]] = []
        delta = None if isinstance(event, Done) else _delta(event)
        if (delta is not None or isinstance(event, Done)) and event.index not in self.started:
            self.started.add(event.index)
            out.append(self._chunk(event.index, {"role": "assistant", "content": None}))
        if isinstance(event, Done):
            self.usage.add_done(event)
            self.ends.append(event)
            extra = {"timings": timings(event)} if self.n_choices == 1 else {}   # rule 5
            return out + [self._chunk(event.index, {}, finish_reason(event), **extra)]
        if delta is None:
            return out
        lps = None
        if self.want_logprobs and isinstance(event, TextDelta):
            lps = {"content": [logprob_entry(lp) for lp in event.logprobs]}
        return out + [self._chunk(event.index, delta, logprobs=lps)]

    def end(self) -> list[dict[str, Any]]:
        """The usage chunk (with `stream_options.include_usage`), unless the stream failed."""
        if self.failed or not self.include_usage:
            return []
        extra = {"timings": timings(self.ends[0])} if self.n_choices == 1 and self.ends else {}
        return [{**self.head, "choices": [], "usage": self.usage.as_dict(), **extra}]

    def result(self) -> dict[str, Any]:
        return chat_body(self.run, self.acc, self.want_logprobs)


async def chat_frames(run: Run, include_usage: bool, want_logprobs: bool, n_choices: int = 1
                      ) -> AsyncIterator[str]:
    """Rule 1: the SSE stream -- each payload as `data:`, then `data: [DONE]`."""
    builder = ChatBuilder(run, include_usage, want_logprobs, n_choices)
    async for event in run.events():
        for payload in builder.feed(event):
            yield f"data: {dumps(payload)}\n\n"
        if builder.failed:
            return
    for payload in builder.end():
        yield f"data: {dumps(payload)}\n\n"
    yield "data: [DONE]\n\n"


# --- completions -----------------------------------------------------------------

@dataclass(slots=True)
class Echo:
    texts: list[str]

    async def of(self, runs: list[Run], front: Frontend) -> "Echo":
        out = []
        for run in runs:
            text = run.prompt_text
            if text is None:
                text = await front.detokenize(run.model, run.prompt_ids)
            out.append(text)
        return Echo(out)


def legacy_logprobs(lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    tokens, offsets = [], []
    for lp in lps:
        tokens.append(lp.token)
        offsets.append(offset)
        offset += len(lp.token)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in lps],
            "text_offset": offsets}


def completion_choice(index: int, c: ChoiceAcc, prefix: str, top: int | None) -> dict[str, Any]:
    assert c.done is not None
    return {"index": index, "text": prefix + "".join(c.text), "finish_reason": finish_reason(c.done),
            "logprobs": legacy_logprobs(c.logprobs, len(prefix)) if top is not None else None}


async def collect_all(runs: list[Run]) -> dict[int, ChoiceAcc]:
    acc: dict[int, ChoiceAcc] = {}
    async for k, event in merged(runs):
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        accumulate(acc, _renumber(event, k, runs[k].n))
    return acc


def _renumber(event: Event, k: int, n: int) -> Event:
    return dataclasses.replace(event, index=k * n + event.index) if k else event


async def completion_frames(runs: list[Run], echo: Echo | None, top: int | None,
                            include_usage: bool) -> AsyncIterator[str]:
    first = runs[0]
    head = {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created,
            "model": first.model, "system_fingerprint": f"frink-g{first.generation}"}

    def frame(index: int, text: str, finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return f"data: {dumps({**head, 'choices': [choice]})}\n\n"

    if echo is not None:
        for k, run in enumerate(runs):
            for j in range(run.n):
                yield frame(k * run.n + j, echo.texts[k])
    usage, offsets = UsageSum(), dict[int, int]()
    async for k, event in merged(runs):
        event = _renumber(event, k, runs[k].n)
        if isinstance(event, ErrorEvent):
            yield f"data: {dumps(error_body(event.to_error()))}\n\n"
            return
        if isinstance(event, Done):
            usage.add_done(event)
            yield frame(event.index, "", finish_reason(event))
        elif isinstance(event, TextDelta):
            lps = None
            if top is not None:
                lps = legacy_logprobs(list(event.logprobs), offsets.get(event.index, 0))
            offsets[event.index] = offsets.get(event.index, 0) + len(event.text)
            yield frame(event.index, event.text, logprobs=lps)
    if include_usage:
        yield f"data: {dumps({**head, 'choices': [], 'usage': usage.as_dict()})}\n\n"
    yield "data: [DONE]\n\n"


def completion_body(runs: list[Run], acc: dict[int, ChoiceAcc], echo: Echo | None,
                    top: int | None) -> dict[str, Any]:
    first, n = runs[0], runs[0].n
    usage = UsageSum()
    for k in range(len(runs)):
        u = UsageSum()
        for j in range(n):
            if acc[k * n + j].done is not None:
                u.add(acc[k * n + j].done.usage)  # type: ignore[union-attr]
        usage.prompt_tokens += u.prompt_tokens
        usage.cached_tokens += u.cached_tokens
        if u.disk_cached_tokens is not None:
            usage.disk_cached_tokens = (usage.disk_cached_tokens or 0) + u.disk_cached_tokens
        usage.completion_tokens += u.completion_tokens
        usage.add_drafts(u.draft_tokens, u.draft_accepted)
    choices = [completion_choice(i, acc[i], echo.texts[i // n] if echo else "", top)
               for i in sorted(acc)]
    return {"id": f"cmpl-{first.id}", "object": "text_completion", "created": first.created,
            "model": first.model, "system_fingerprint": f"frink-g{first.generation}",
            "choices": choices, "usage": usage.as_dict()}
