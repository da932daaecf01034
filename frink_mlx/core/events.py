"""The protocol-neutral event stream a generation produces.

core/output.py turns the engine's token ids into these; each adapter renders
them into its own frames (OpenAI chunks, Anthropic content blocks, Responses
items, llama.cpp frames). `index` is the choice index when `n > 1`.

Order for one choice:
    (ReasoningDelta | TextDelta | ToolCallStart ToolCallDelta* ToolCallEnd)*  Done
`Done` is always last, exactly once per choice; a failure mid-stream is an
`ErrorEvent` followed by nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterable, AsyncIterator, Callable, Literal, Union

from ..errors import EngineFailure, FrinkError, InvalidRequest, Unavailable

FinishReason = Literal["stop", "length", "tool_calls", "abort", "error"]
StopKind = Literal["eos", "stop_sequence", "length", "tool_calls", "abort", "error"]


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    token_id: int
    token: str
    logprob: float
    bytes: list[int] | None = None
    top: tuple["TokenLogprob", ...] = ()


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Of cached_tokens, read back from the SSD tier (frink extension; None = tier off).
    disk_cached_tokens: int | None = None
    # Where the re-rendered prompt stopped matching the ids generated earlier
    # in this conversation (frink extension; None = no divergence measured).
    prefix_divergence: int | None = None
    reasoning_tokens: int | None = None
    # Speculative decoding (engine/speculative/): tokens drafted and accepted for this
    # choice; None = the request did not speculate (off, or opted out).
    draft_tokens: int | None = None
    draft_accepted: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True, frozen=True)
class TextDelta:
    text: str
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(slots=True, frozen=True)
class ReasoningDelta:
    text: str
    index: int = 0


@dataclass(slots=True, frozen=True)
class ToolCallStart:
    call_index: int
    id: str
    name: str
    index: int = 0


@dataclass(slots=True, frozen=True)
class ToolCallDelta:
    call_index: int
    arguments: str
    index: int = 0


@dataclass(slots=True, frozen=True)
class ToolCallEnd:
    call_index: int
    arguments: str  # the complete JSON arguments
    index: int = 0


@dataclass(slots=True)
class Done:
    finish_reason: FinishReason
    usage: Usage
    stop_kind: StopKind = "eos"
    stop_sequence: str | None = None   # the matched stop string (or eos token text)
    index: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # prompt_ms, predicted_ms, ttft_ms


@dataclass(slots=True, frozen=True)
class ErrorEvent:
    message: str
    code: str = "engine_error"
    status: int = 500
    index: int = 0
    retry_after_s: float | None = None
    param: str | None = None

    @classmethod
    def of(cls, exc: FrinkError, index: int = 0) -> "ErrorEvent":
        """A FrinkError raised mid-stream, keeping its status, code and Retry-After."""
        return cls(exc.message, code=exc.code, status=exc.status, index=index,
                   retry_after_s=exc.retry_after_s, param=exc.param)

    def to_error(self) -> FrinkError:
        """The error an adapter raises for a response not yet sent (its real status)."""
        kind = _ERROR_BY_STATUS.get(self.status, EngineFailure)
        err = kind(self.message, code=self.code, param=self.param,
                   retry_after_s=self.retry_after_s)
        err.status = self.status
        return err


_ERROR_BY_STATUS: dict[int, type[FrinkError]] = {400: InvalidRequest, 503: Unavailable}


Event = Union[TextDelta, ReasoningDelta, ToolCallStart, ToolCallDelta, ToolCallEnd, Done, ErrorEvent]


async def choice_events(events: AsyncIterable[Event], index: int = 0) -> AsyncIterator[Event]:
    """Choice `index`'s events, up to and including its `Done` or `ErrorEvent`."""
    async for event in events:
        if event.index != index:
            continue
        yield event
        if isinstance(event, (Done, ErrorEvent)):
            return


async def drain_choice(events: AsyncIterable[Event], feed: Callable[[Event], object],
                       index: int = 0) -> None:
    """Feed choice `index`'s events to `feed` up to its `Done`.

    For the non-streaming paths, where nothing has been sent yet: an
    `ErrorEvent` raises its own error (status, code, Retry-After) instead.
    """
    async for event in choice_events(events, index):
        if isinstance(event, ErrorEvent):
            raise event.to_error()
        feed(event)
