"""Token ids -> protocol-neutral events, per choice.

The engine hands back one `StepOutput` per generated token per row; this
module turns them into `core.events` without knowing MLX or HTTP. The pipeline
for one choice, in order:

    ids --IncrementalDetokenizer--> stable text --StopMatcher--> text before any stop
        --StreamParser (reasoning / tool calls)--> events --(+ logprobs)--> Done

Rules:
1. UTF-8 safety: text is released only when the decoded window no longer ends
   in U+FFFD, so a multi-byte character split across tokens is never sent in
   halves (the sliding prefix/read-offset scheme of TGI and vLLM).
2. Stop strings are matched on the accumulated text, across token boundaries.
   Text that could still be the start of a stop is held back, so a partial stop
   never leaks; the stop itself is never sent. The stops are prepared once per
   request (`StopSet`) and what is held is shorter than the longest stop, so a
   token's matching costs what its stops are (count and length, bounded by
   core/checks.py rule 4), never how much text came before.
3. An end-of-sequence token (one of `eos_ids`) ends the row without text.
4. Finish reasons: eos / stop string -> "stop" ("tool_calls" when the parser
   emitted a tool call), the engine's length -> "length", abort -> "abort";
   an engine error becomes one `ErrorEvent` and nothing after it.
5. Each `Done` carries that choice's usage: the shared prompt counts plus its
   own completion tokens (adapters sum completion tokens over choices).
6. Logprobs ride on the first `TextDelta` emitted after their tokens' text is
   released; those still held when the choice ends go out on an empty delta.
7. With `parallel_tool_calls` off the choice ends ("tool_calls") as soon as its
   first call is complete: the row is aborted instead of decoding calls the
   parser would only drop.
8. `max_predict_ms` (llama-server's `t_max_predict_ms`, what llama.vim sends so
   a slow machine still answers in time): when a token's text holds a newline
   and that many ms have passed since the first token, the choice ends there
   as if its length limit came ("length"), keeping the text so far -- so a
   completion is cut at a line's end, as llama-server cuts it.
9. `min_indent` (llama-server's `n_indent`, the cursor line's indentation that
   llama.vim sends): every line after the first must start with at least that
   many spaces or tabs; the first line that does not ends the choice
   ("length"), its text cut after its indentation, as llama-server cuts it. A
   new line's leading whitespace is held until its first other character
   decides.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

from .events import Done, ErrorEvent, Event, TextDelta, TokenLogprob, ToolCallEnd, Usage
from .parsers import MarkupInfo, StreamParser, build_parser
from .request import GenRequest

if TYPE_CHECKING:  # core never imports the engine at run time (app -> adapters -> core <- engine)
    from ..engine.types import StepOutput

Decode = Callable[[Sequence[int]], str]


@dataclass(slots=True)
class TokenText:
    """The tokenizer's two views the pipeline needs, passed in by the engine side."""

    decode: Decode                      # ids -> text, special tokens kept
    piece: Callable[[int], str] | None = None   # one token -> its text (for logprobs)
    piece_bytes: Callable[[int], bytes] | None = None  # one token -> its exact bytes


class IncrementalDetokenizer:
    """Rule 1: release decoded text only once it is complete UTF-8."""

    def __init__(self, decode: Decode) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0   # start of the window re-decoded for context
        self._read = 0     # ids before this have had their text released

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        window = self._ids[self._prefix:]
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(window)
        if len(text) <= len(prefix_text) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text):]

    def flush(self) -> str:
        """Whatever is still held (possibly an incomplete character) at the end."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""


@dataclass(frozen=True, slots=True)
class StopSet:
    """A request's stop strings, prepared once for all its choices (rule 2).

    `ordered` is sorted, so the stops that begin with some text sit together
    and one bisection finds whether any does; `max_len` bounds the text that
    can still be the start of one."""

    stops: tuple[str, ...]
    ordered: tuple[str, ...]
    firsts: frozenset[str]
    max_len: int

    @classmethod
    def of(cls, stops: Sequence[str]) -> "StopSet":
        kept = tuple(dict.fromkeys(s for s in stops if s))
        return cls(kept, tuple(sorted(kept)), frozenset(s[0] for s in kept),
                   max((len(s) for s in kept), default=0))

    def starts_one(self, text: str) -> bool:
        """True when some stop string begins with `text`."""
        at = bisect.bisect_left(self.ordered, text)
        return at < len(self.ordered) and self.ordered[at].startswith(text)


class StopMatcher:
    """Rule 2: find the earliest stop string; hold back what may begin one.

    Per call the work is bounded by the stops' count and longest length, never
    by the text so far: the held tail is shorter than the longest stop."""

    def __init__(self, stops: Sequence[str] | StopSet) -> None:
        self.set = stops if isinstance(stops, StopSet) else StopSet.of(stops)
        self._held = ""
        self.matched: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        return self.set.stops

    def feed(self, text: str) -> str:
        """Text safe to release; sets `matched` once a stop is found."""
        if self.matched is not None:
            return ""
        if not self.set.stops:
            return text
        buf = self._held + text
        hit_at, hit = len(buf) + 1, None
        for stop in self.set.stops:
            at = buf.find(stop)
            if at != -1 and at < hit_at:
                hit_at, hit = at, stop
        if hit is not None:
            self.matched, self._held = hit, ""
            return buf[:hit_at]
        keep = self._partial_len(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def _partial_len(self, buf: str) -> int:
        """The longest tail of `buf` some stop begins with (no stop is in `buf`)."""
        stops = self.set
        for at in range(max(0, len(buf) - stops.max_len + 1), len(buf)):
            if buf[at] in stops.firsts and stops.starts_one(buf[at:]):
                return len(buf) - at
        return 0

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.matched is not None else held


@dataclass(slots=True)
class IndentLimit:
    """Rule 9: hold a new line's indentation until it is known; say when it falls short."""

    min_indent: int
    judged: bool = True   # the first line (the cursor's own) is never judged
    held: str = ""
    cut: bool = False

    def feed(self, text: str) -> str:
        """The text to release; sets `cut` (and drops the rest) at a short line."""
        out: list[str] = []
        for ch in text:
            if self.cut:
                break
            if not self.judged:
                if ch in " \t":
                    self.held += ch
                    continue
                out.append(self.held)
                self.cut = len(self.held) < self.min_indent
                self.judged, self.held = True, ""
                if self.cut:
                    break
            out.append(ch)
            if ch == "\n":
                self.judged = False
        return "".join(out)

    def flush(self, text: str) -> str:
        """At the end: `text` fed through, then whatever indentation is held."""
        out = self.feed(text)
        held, self.held = self.held, ""
        return out if self.cut else out + held


@dataclass(slots=True)
class ChoiceState:
    index: int
    detok: IncrementalDetokenizer
    stops: StopMatcher
    parser: StreamParser
    num_tokens: int = 0
    ids: list[int] = field(default_factory=list)   # every generated id, EOS included
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    done: bool = False
    first_token_at: float | None = None
    indent: IndentLimit | None = None   # rule 9


class OutputPipeline:
    """All choices of one request: feed StepOutputs, get events (see rules)."""

    def __init__(self, request: GenRequest, markup: MarkupInfo, text: TokenText, *,
                 prompt_tokens: int, eos_ids: frozenset[int], started_at: float | None = None) -> None:
        self.request = request
        self.text = text
        self.eos_ids = eos_ids
        self.usage = Usage(prompt_tokens=prompt_tokens)
        self.started_at = time.monotonic() if started_at is None else started_at
        self.want_logprobs = request.sampling.logprobs
        stops = StopSet.of(request.stop)   # once per request, shared by its choices
        self.choices = [
            ChoiceState(i, IncrementalDetokenizer(text.decode), StopMatcher(stops),
                        build_parser(markup, request, i),
                        indent=IndentLimit(request.min_indent) if request.min_indent else None)
            for i in range(request.n)
        ]

    @property
    def all_done(self) -> bool:
        return all(c.done for c in self.choices)

    def on_step(self, step: StepOutput) -> list[Event]:
        """Events produced by one engine output (rules 1-6)."""
        if step.num_prompt_tokens is not None:
            self.usage.prompt_tokens = step.num_prompt_tokens
        if step.num_cached_tokens is not None:
            self.usage.cached_tokens = step.num_cached_tokens
        if step.num_disk_cached_tokens is not None:
            self.usage.disk_cached_tokens = step.num_disk_cached_tokens
        if step.num_drafted is not None:
            self.usage.draft_tokens = (self.usage.draft_tokens or 0) + step.num_drafted
            self.usage.draft_accepted = (self.usage.draft_accepted or 0) + \
                (step.num_draft_accepted or 0)
        choice = self.choices[step.index]
        if choice.done:
            return []  # tokens after a stop string, until the row ends
        if step.finish == "error" or step.finish == "constraint" and step.error:
            choice.done = True
            return [ErrorEvent(step.error or "generation failed", index=choice.index)]
        events: list[Event] = []
        if step.token_id is not None:
            events += self._on_token(choice, step)
        if choice.done:
            return events
        if step.finish is not None:
            events += self._finish(choice, _FINISH[step.finish], stop_kind=_STOP_KIND[step.finish])
        return events

    def _on_token(self, choice: ChoiceState, step: StepOutput) -> list[Event]:
        assert step.token_id is not None
        choice.num_tokens += 1
        choice.ids.append(step.token_id)
        if choice.first_token_at is None:
            choice.first_token_at = time.monotonic()
        is_eos = step.finish == "eos" and step.token_id in self.eos_ids and not self.request.ignore_eos
        if is_eos:
            return []
        if self.want_logprobs and step.logprob is not None:
            choice.pending_logprobs.append(self._logprob(step))
        released = choice.stops.feed(choice.detok.add(step.token_id))
        if choice.indent is not None:
            released = choice.indent.feed(released)
        events = self._parse(choice, released)
        if choice.stops.matched is not None:
            events += self._finish(choice, "stop", stop_kind="stop_sequence",
                                   stop_sequence=choice.stops.matched)
        elif not self.request.parallel_tool_calls and any(
                isinstance(e, ToolCallEnd) for e in events):  # rule 7
            events += self._finish(choice, "tool_calls", stop_kind="tool_calls")
        elif self._out_of_time(choice, released) or choice.indent is not None and choice.indent.cut:
            events += self._finish(choice, "length", stop_kind="length")
        return events

    def _out_of_time(self, choice: ChoiceState, text: str) -> bool:
        """Rule 8: a token holding a newline after max_predict_ms since the first token ends
    the choice ("length")."""
        budget_ms = self.request.max_predict_ms
        if budget_ms is None or choice.first_token_at is None or "\n" not in text:
            return False
        return (time.monotonic() - choice.first_token_at) * 1e3 > budget_ms

    def _parse(self, choice: ChoiceState, text: str, final: bool = False) -> list[Event]:
        events = choice.parser.feed(text) if text else []
        if final:
            events += choice.parser.finish()
        if choice.pending_logprobs:
            events = self._attach_logprobs(choice, events, final)
        return events

    def _attach_logprobs(self, choice: ChoiceState, events: list[Event], final: bool) -> list[Event]:
        for i, ev in enumerate(events):
            if isinstance(ev, TextDelta):
                lps = (*ev.logprobs, *choice.pending_logprobs)
                choice.pending_logprobs.clear()
                events[i] = dataclasses.replace(ev, logprobs=lps)
                return events
        if final:
            events.append(TextDelta("", index=choice.index, logprobs=tuple(choice.pending_logprobs)))
            choice.pending_logprobs.clear()
        return events

    def _token(self, token_id: int, logprob: float, top: tuple[TokenLogprob, ...] = ()
               ) -> TokenLogprob:
        """A token's text and exact bytes; a partial UTF-8 piece is shown as
        `bytes:\\xNN...` (OpenAI's convention) while `bytes` stays exact."""
        piece = self.text.piece(token_id) if self.text.piece else self.text.decode([token_id])
        raw = self.text.piece_bytes(token_id) if self.text.piece_bytes else piece.encode()
        if "\ufffd" in piece and raw and b"\xef\xbf\xbd" not in raw:
            piece = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return TokenLogprob(token_id, piece, logprob, list(raw), top)

    def _logprob(self, step: StepOutput) -> TokenLogprob:
        top = tuple(self._token(t.token_id, t.logprob)
                    for t in (step.top_logprobs or [])[: self.request.sampling.top_logprobs])
        assert step.token_id is not None and step.logprob is not None
        return self._token(step.token_id, step.logprob, top)

    def _finish(self, choice: ChoiceState, reason: str, *, stop_kind: str,
                stop_sequence: str | None = None) -> list[Event]:
        tail = "" if choice.stops.matched is not None else choice.stops.feed(choice.detok.flush())
        tail += choice.stops.flush()
        if choice.indent is not None:
            tail = choice.indent.flush(tail)
        events = self._parse(choice, tail, final=True)
        if choice.stops.matched is not None and stop_sequence is None:
            stop_kind, stop_sequence, reason = "stop_sequence", choice.stops.matched, "stop"
        if reason == "stop" and choice.parser.saw_tool_call:
            reason, stop_kind = "tool_calls", "tool_calls"
        choice.done = True
        usage = dataclasses.replace(self.usage, completion_tokens=choice.num_tokens)
        events.append(Done(reason, usage, stop_kind=stop_kind,  # type: ignore[arg-type]
                           stop_sequence=stop_sequence, index=choice.index,
                           timings=self._timings(choice)))
        return events

    def _timings(self, choice: ChoiceState) -> dict[str, float]:
        now = time.monotonic()
        if choice.first_token_at is None:
            return {}
        ttft_ms = (choice.first_token_at - self.started_at) * 1000.0
        return {"ttft_ms": ttft_ms, "prompt_ms": ttft_ms,
                "predicted_ms": (now - choice.first_token_at) * 1000.0}

    def abort(self, reason: str = "abort") -> list[Event]:
        """End every open choice (client went away, stream ended early)."""
        events: list[Event] = []
        for choice in self.choices:
            if not choice.done:
                events += self._finish(choice, reason, stop_kind=reason)
        return events


_FINISH = {"eos": "stop", "length": "length", "abort": "abort", "constraint": "stop", "error": "error"}
_STOP_KIND = {"eos": "eos", "length": "length", "abort": "abort", "constraint": "eos", "error": "error"}
