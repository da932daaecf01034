"""Decode handles: everything one request needs, taken once from its lease.

Why: a route that passed model, tokenizer, KV pool, ceiling and gate by hand
could transpose them, or pair one generation's tokenizer with another's
engine. `DecodeHandles.take(generation)` is the only way in, so every
generating route renders, tokenizes and submits against one generation.

Rules:
1. An encoder-only model is refused here, once for every generating route,
   naming the model, its kind and /v1/embeddings.
2. `start()` renders the prompt and tokenizes it before anything is sent to
   the client, so template errors and context overflows are real 400s.
3. A prompt that can never fit -> ContextLengthExceeded (400, with the
   numbers). max_tokens None -> the registry entry's `max_tokens` cap when it
   has one, else what room is left under the ceiling (OpenAI's "up to the
   context"); a client's max_tokens beyond that room is clamped to it (issue
   4; finish_reason says "length") and reported: `Run.max_tokens_requested`
   keeps what was asked, and the response carries `frink-max-tokens` (the
   budget used) and `frink-max-tokens-requested` (http/access.py rule 5).
   `Run.context_bound` says the budget is that room (llama.cpp's `truncated`
   when the run uses it all up).
4. models.toml `[sampling]` defaults fill the fields the client did not send.
5. The stop token ids are the tokenizer's EOS ids unless `ignore_eos`.
6. A `Run` owns the lease: it is released when the events end or on
   `abort()`, whichever comes first (both idempotent).
7. Prefix divergence (a frink extension, issue 4): a `TurnMemory` per
   generation keeps the last turns' ids (prompt + generated answer). A new
   prompt that continues one of them (its whole prompt matches) but differs
   inside its answer -- the chat template re-rendered the answer into other
   ids -- reports the index of the first differing token as
   `Usage.prefix_divergence`: the prefix cache cannot reach past it. A prompt
   that continues a turn exactly, or none, reports nothing (None).
8. `Run.admitted()` waits until the engine starts the request and raises the
   FrinkError that ended it before (Overloaded after queue_timeout_s), so
   Frontend.generate refuses with its real status before any byte is sent. A
   FrinkError raised later becomes an ErrorEvent keeping status, code and
   Retry-After; any other exception an ErrorEvent 500.
9. A choice that ends on a stop string (n > 1) aborts its own engine row, so
   its blocks are freed and it stops taking batch slots while the others go on.
10. `thinking_budget_tokens` is enforced per row by a ThinkBudget row
   constraint (think_budget.py): after that many tokens inside an open think
   block the think-end marker is forced. A model without think markers never
   opens a block, so there is nothing to cap.
11. `cut(error)` (the drain at shutdown) ends a run early: its stream ends
   with an ErrorEvent of `error` (status, code, Retry-After), which each
   protocol renders as its own terminal error frame -- never a silent end and
   never a finish reason that pretends the answer was complete.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..config import ImageLimits
from ..core.events import Done, ErrorEvent, Event
from ..core.output import OutputPipeline, TokenText
from ..core.parsers import MarkupInfo, detect_format
from ..core.prompt import RenderedPrompt, encode_text, render_prompt
from ..core.request import GenRequest, SamplingParams
from ..engine.engine import Engine
from ..engine.stream import SeqStream
from ..engine.think_budget import with_think_budget
from ..engine.types import SeqRequest
from ..errors import ContextLengthExceeded, FrinkError, InvalidRequest, ModelNotGenerative, UnsupportedField
from ..models.vision import ImageFeatures, Vision
from .generation import Generation
from .hub import Lease
from .turn_memory import TurnMemory
from .vision import render_vision, request_images

NO_LIMITS = ImageLimits(max_images=1 << 30, max_image_bytes=1 << 40, max_image_pixels=1 << 40)

log = logging.getLogger("frink_mlx.handles")

_SAMPLING_DEFAULT = SamplingParams()
_DEFAULTABLE = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def markup_of(tokenizer: Any) -> MarkupInfo:
    """What mlx-lm's TokenizerWrapper knows about thinking and tool-call markers."""
    parser = getattr(tokenizer, "tool_parser", None)
    # the format is the parser's module (mlx_lm.tool_parsers.json_tools); every
    # module names its function parse_tool_call (fix by the adapters helper)
    fmt = getattr(parser, "__module__", None)
    return MarkupInfo(
        think_start=getattr(tokenizer, "think_start", None),
        think_end=getattr(tokenizer, "think_end", None),
        tool_call_start=getattr(tokenizer, "tool_call_start", None),
        tool_call_end=getattr(tokenizer, "tool_call_end", None),
        tool_format=(fmt.rsplit(".", 1)[-1] if isinstance(fmt, str) else None)
        or detect_format(getattr(tokenizer, "chat_template", None)),  # e.g. Llama 3 JSON calls
    )


_HEX_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _gpt2_byte_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's bytes_to_unicode), inverted; built once
    (0.45 ms, once paid by every DecodeHandles.take: per piece of a llama.cpp request)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


GPT2_BYTE_DECODER = _gpt2_byte_decoder()   # a constant table


def token_text(tokenizer: Any) -> TokenText:
    """decode / piece / piece_bytes for core.output, from the tokenizer."""
    byte_decoder = GPT2_BYTE_DECODER

    def decode(ids: Any) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=False,
                                clean_up_tokenization_spaces=False)

    def piece_bytes(token_id: int) -> bytes:
        text = decode([token_id])
        if "\ufffd" not in text:
            return text.encode()
        raw = tokenizer.convert_ids_to_tokens(token_id)
        hex_byte = _HEX_BYTE.match(raw or "")
        if hex_byte:
            return bytes([int(hex_byte.group(1), 16)])
        if raw and all(c in byte_decoder for c in raw):
            return bytes(byte_decoder[c] for c in raw)
        return text.encode()

    return TokenText(decode=decode, piece=lambda i: decode([i]), piece_bytes=piece_bytes)


def apply_sampling_defaults(request: GenRequest, defaults: Any) -> SamplingParams:
    """Rule 4: a model default replaces a field the client did not send."""
    if defaults is None:
        return request.sampling
    sent = request.sampling_sent
    changes = {}
    for name in _DEFAULTABLE:
        value = getattr(defaults, name, None)
        if value is None:
            continue
        unsent = name not in sent if sent is not None else \
            getattr(request.sampling, name) == getattr(_SAMPLING_DEFAULT, name)
        if unsent:
            changes[name] = value
    return dataclasses.replace(request.sampling, **changes) if changes else request.sampling


@dataclass(frozen=True, slots=True)
class DecodeHandles:
    generation: Generation
    model: nn.Module
    tokenizer: TokenizerWrapper
    engine: Engine
    context_ceiling: int
    markup: MarkupInfo
    text: TokenText
    eos_ids: frozenset[int]
    template: str | None
    vision: Vision | None = None   # a vision checkpoint's processor and tower (vision.py)

    @classmethod
    def take(cls, gen: Generation) -> "DecodeHandles":
        """Rule 1: the one check that refuses encoders on generating routes."""
        if gen.engine is None or gen.spec.kind != "generative":
            raise ModelNotGenerative(gen.spec.name, gen.spec.kind)
        tok = gen.loaded.tokenizer
        ceiling = gen.plan.context_ceiling if gen.plan is not None else gen.loaded.context_length
        # the loader already installed models.toml's chat_template on the tokenizer
        return cls(gen, gen.loaded.model, tok, gen.engine, int(ceiling), markup_of(tok),
                   token_text(tok), frozenset(getattr(tok, "eos_token_ids", ()) or ()), None,
                   gen.loaded.vision)

    def render(self, request: GenRequest, *, bounded: bool = False) -> RenderedPrompt:
        """`bounded`: refuse a text far past the ceiling early (core/prompt.py rule 8)."""
        return render_prompt(self.tokenizer, request, template=self.template,
                             think_start=self.markup.think_start,
                             tool_format=self.markup.tool_format,
                             ceiling=self.context_ceiling if bounded else None)

    def render_images(self, request: GenRequest, limits: ImageLimits | None = None,
                      bounded: bool = False
                      ) -> tuple[RenderedPrompt, ImageFeatures | None, list[int] | None]:
        """`render`, or on a vision model with images serving/vision.py's rendering:
        (the prompt, the engine's image inputs, the prefix cache's keys)."""
        if self.vision is None or not request_images(request):
            return self.render(request, bounded=bounded), None, None
        rendered, images, keys = render_vision(self.vision, self.tokenizer, request,
                                               self.template, limits or NO_LIMITS,
                                               self.markup.tool_format)
        think = self.markup.think_start   # a chat's rendering only (a raw prompt's is as written)
        if think and request.messages is not None and (rendered.text or "").rstrip().endswith(think):
            rendered = dataclasses.replace(rendered, opens_thinking=True)
        return rendered, images, keys

    def max_tokens_for(self, request: GenRequest, num_prompt: int) -> int:
        """Rule 3: the entry's cap, else the room left under the ceiling; a larger ask is
    clamped to that room."""
        param = "messages" if request.messages is not None else "prompt"
        if num_prompt >= self.context_ceiling:
            raise ContextLengthExceeded(num_prompt, self.context_ceiling, param=param)
        room = self.context_ceiling - num_prompt
        if request.max_tokens is None:
            cap = self.generation.spec.max_tokens if self.generation is not None else None
            return min(cap, room) if cap else room
        if request.max_tokens < 1:
            raise InvalidRequest("'max_tokens' must be at least 1.", param="max_tokens")
        return min(request.max_tokens, self.context_ceiling - num_prompt)

    def prepare(self, request: GenRequest, limits: ImageLimits | None = None) -> "Prepared":
        """Render, tokenize and check (rules 2-3); nothing is submitted yet. Images on a
        vision model are decoded and bounded by `limits` (serving/vision.py)."""
        if request.n < 1:
            raise InvalidRequest("'n' must be at least 1.", param="n")
        rendered, images, keys = self.render_images(request, limits, bounded=True)
        max_tokens = self.max_tokens_for(request, len(rendered.ids))
        markup = dataclasses.replace(self.markup, prompt_opens_thinking=rendered.opens_thinking)
        if rendered.injected_tools:   # core/prompt.py rule 6: we asked for Hermes calls
            markup = dataclasses.replace(markup, tool_format="json_tools",
                                         tool_call_start="<tool_call>",
                                         tool_call_end="</tool_call>")
        return Prepared(request, rendered, max_tokens, markup, images, keys,
                        0 if images is not None else len(request.images))

    def submit(self, prepared: "Prepared", lease: Lease | None = None,
               constraints: list[Any] | None = None, memory: TurnMemory | None = None
               ) -> "Run":
        """Hand the prepared request to the engine (rules 4-5); the Run streams it."""
        request, rendered = prepared.request, prepared.rendered
        request_id = request.request_id or f"req-{uuid.uuid4().hex[:24]}"
        constraints = self._budgeted(prepared, constraints)
        sampling = apply_sampling_defaults(request, self.generation.spec.sampling)
        seq = SeqRequest(
            request_id=request_id, prompt_ids=rendered.ids, sampling=sampling,
            max_tokens=prepared.max_tokens,
            stop_token_ids=frozenset() if request.ignore_eos else self.eos_ids,
            n=request.n, cache_prompt=request.cache_prompt, cache_salt=request.cache_salt,
            constraints=constraints, speculative=request.speculative,
            images=prepared.images, key_ids=prepared.key_ids)
        pipeline = OutputPipeline(request, prepared.markup, self.text,
                                  prompt_tokens=len(rendered.ids), eos_ids=self.eos_ids)
        if memory is not None and request.messages is not None:
            pipeline.usage.prefix_divergence = memory.divergence(rendered.ids)
        stream = self.engine.submit(seq)
        return Run(id=request_id, model=self.generation.spec.name,
                   generation=self.generation.number, created=int(time.time()),
                   prompt_ids=rendered.ids, prompt_text=rendered.text, markup=prepared.markup,
                   max_tokens=prepared.max_tokens, _stream=stream, _pipeline=pipeline,
                   max_tokens_requested=request.max_tokens, sampling=sampling,
                   context_bound=self._context_bound(prepared),
                   images_omitted=prepared.images_omitted,
                   _lease=lease, _handles=self, _memory=memory)

    def _context_bound(self, prepared: "Prepared") -> bool:
        """Rule 3: the budget is the room left under the ceiling, below what was asked."""
        room = self.context_ceiling - len(prepared.rendered.ids)
        asked = prepared.request.max_tokens
        return prepared.max_tokens == room and (asked is None or asked > room)

    def _budgeted(self, prepared: "Prepared", constraints: list[Any] | None) -> list[Any] | None:
        """Rule 10: wrap each row's constraint in its thinking budget."""
        budget, markup = prepared.request.thinking_budget_tokens, prepared.markup
        if budget is None or not markup.think_end:
            return constraints
        end_ids = encode_text(self.tokenizer, markup.think_end, add_special_tokens=False)
        start_ids = encode_text(self.tokenizer, markup.think_start, add_special_tokens=False) \
            if markup.think_start else []
        return with_think_budget(constraints, prepared.request.n, budget,
                                 think_start_ids=start_ids, think_end_ids=end_ids,
                                 opens_inside=bool(markup.prompt_opens_thinking))

    def start(self, request: GenRequest, lease: Lease | None = None) -> "Run":
        """prepare + submit, unconstrained (structured output goes through the Frontend)."""
        if request.response_format is not None:
            raise UnsupportedField("response_format", "needs the structured-output engine")
        return self.submit(self.prepare(request), lease)


@dataclass(frozen=True, slots=True)
class Prepared:
    request: GenRequest
    rendered: RenderedPrompt
    max_tokens: int
    markup: MarkupInfo
    images: ImageFeatures | None = None   # serving/vision.py: the engine's image inputs
    key_ids: list[int] | None = None      # ... and the prefix cache's keys (rule 4 there)
    images_omitted: int = 0               # image parts read as placeholders (core/images.py)


@dataclass(slots=True)
class Run:
    """One submitted generation: its ids, its events, its abort."""

    id: str
    model: str            # the served registry name
    generation: int
    created: int          # unix seconds
    prompt_ids: list[int]
    prompt_text: str | None
    markup: MarkupInfo
    max_tokens: int
    _stream: SeqStream
    _pipeline: OutputPipeline
    _lease: Lease | None
    _handles: DecodeHandles
    max_tokens_requested: int | None = None  # rule 3: what the client asked (None: nothing)
    sampling: SamplingParams | None = None   # rule 4: what it runs with, model defaults applied
    context_bound: bool = False   # rule 3: running out of budget means the context is full
    images_omitted: int = 0       # image parts the model read as placeholders (core/images.py)
    _memory: TurnMemory | None = None
    _finished: bool = False
    _cut: FrinkError | None = None
    on_close: Callable[["Run"], None] | None = None  # the Frontend forgets it (hub rule 4)

    @property
    def finished(self) -> bool:
        return self._finished

    def cut(self, error: FrinkError) -> None:
        """Rule 11: end this run now with `error` as its terminal event."""
        if not self._finished and self._cut is None:
            self._cut = error
            self._stream.abort()

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def n(self) -> int:
        return self._pipeline.request.n

    def output_ids(self, index: int = 0) -> list[int]:
        """The ids choice `index` has generated so far (EOS included once generated)."""
        return list(self._pipeline.choices[index].ids)

    @property
    def handles(self) -> DecodeHandles:
        return self._handles

    def tally(self) -> dict[str, Any]:
        """What the access log and metrics report about this run (http/access.py rule 3)."""
        pipeline = self._pipeline
        firsts = [c.first_token_at for c in pipeline.choices if c.first_token_at is not None]
        return {"model": self.model, "generation": self.generation,
                "prompt_tokens": pipeline.usage.prompt_tokens,
                "cached_tokens": pipeline.usage.cached_tokens,
                "completion_tokens": sum(c.num_tokens for c in pipeline.choices),
                "ttft_s": min(firsts) - pipeline.started_at if firsts else None}

    async def admitted(self) -> None:
        """Rule 8: return once the engine runs this request; raise what refused it."""
        wait = getattr(self._stream, "admitted", None)
        if wait is None:  # an engine stream without admission signalling
            return
        try:
            await wait()
        except BaseException:
            self._close()
            raise

    async def events(self) -> AsyncIterator[Event]:
        """Events for every choice; `Done` once per choice (or an ErrorEvent)."""
        pipeline = self._pipeline
        steps = self._stream.__aiter__()
        try:
            async for step in steps:
                if self._cut is not None:
                    break
                for event in pipeline.on_step(step):
                    if isinstance(event, Done) and step.finish is None and self.n > 1:
                        self._stream.abort(event.index)  # rule 9: a stop string ended it
                    yield event
                if pipeline.all_done:
                    break
            if self._cut is not None and not pipeline.all_done:
                yield ErrorEvent.of(self._cut)  # rule 11
            elif not pipeline.all_done:
                for event in pipeline.abort("abort"):
                    yield event
        except FrinkError as exc:  # rule 8: e.g. Overloaded after a preemption
            log.info("generation %s ended: %r", self.id, exc)
            yield ErrorEvent.of(exc)
        except Exception as exc:  # noqa: BLE001 - an engine crash is an event, not a hang
            log.exception("generation %s failed", self.id)
            yield ErrorEvent(f"generation failed: {exc}")
        finally:
            self._close()
            aclose = getattr(steps, "aclose", None)
            if aclose is not None:
                await aclose()

    def _close(self) -> None:
        if not self._finished:
            self._finished = True
            self._stream.abort()  # no-op after a normal end; frees rows ended by stop strings
            if self._memory is not None and self._pipeline.all_done:
                self._memory.remember(self.prompt_ids, self._pipeline.choices[0].ids)
            if self.on_close is not None:
                self.on_close(self)
        if self._lease is not None:
            self._lease.release()

    async def abort(self) -> None:
        """Stop the decode (within one engine step) and release the lease."""
        self._close()
