"""The CPU work of large requests runs in worker threads, never on the event loop.

Why: rendering a chat template and tokenizing are pure CPU, and on an 8 MiB body
they take seconds (a 1.6 MiB prompt blocked the loop for 11 s on the test
tokenizer): while they run on the loop nothing else is answered -- not /health,
not a neighbour's next frame. A thread hop costs tens of microseconds, so small
inputs (nearly every request) stay on the loop where they cost less than the hop.

Rules:
1. `input_chars(request)` sizes a request by the text it renders: message
   contents, reasoning and tool-call arguments, the prompt (a list of ids counts
   one per element), tool names, descriptions and schemas (encoded to JSON, which is
   cheap beside rendering it), and what the template wraps around each message
   (MESSAGE_CHARS) and each tool (TOOL_CHARS) -- 512 bare tools render to 150,000
   characters, not the 10,600 of their names and schemas, and took 30 ms on the
   loop (120 ms on a loaded machine). It is an estimate, not a count of tokens, and
   it stops counting once past the threshold, so sizing costs little on the loop.
   `texts_chars(texts)` sizes a batch of separately tokenized texts (llama.cpp's
   text logit_bias keys, a mixed prompt's pieces): each text's length plus
   TEXT_CHARS, one encode call's fixed cost (about 40 us, what 64 characters
   cost), so a thousand short texts are large work, as they are.
2. `Offload.run(size, fn, *args)` calls `fn` inline when `size` is below
   `threshold` (OFFLOAD_CHARS), else in a worker thread. At most `max_threads`
   large jobs run at once (the others wait their turn, on the loop, costing
   nothing), so a burst of hostile bodies cannot take every worker thread the
   model loads and grammar compiles also need.
3. The caller is not abandoned: a request cancelled (its client gone) while its
   job runs waits for the job to end before letting go of its lease, so nothing
   uses a tokenizer whose generation the hub believes idle.
4. Tokenizers are shared between the loop and these threads: mlx-lm's fast
   tokenizers encode and decode under a shared borrow, and nothing here changes
   their truncation or padding.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import anyio
import msgspec

from .request import GenRequest

T = TypeVar("T")

OFFLOAD_CHARS = 64 * 1024   # rule 2: about 10 ms of tokenizing, against a hop of ~50 us
OFFLOAD_THREADS = 2
TEXT_CHARS = 64             # rule 1: one encode call's fixed cost, in characters
MESSAGE_CHARS = 32          # rule 1: a message's role markers as a ChatML template renders them
TOOL_CHARS = 256            # rule 1: a tool's JSON wrapping and the template's lines around it
_ENCODE = msgspec.json.Encoder()


def input_chars(request: GenRequest, enough: int = OFFLOAD_CHARS) -> int:
    """Rule 1: about how much text `request` renders to (counting stops past `enough`)."""
    size = 0
    prompt = request.prompt
    if prompt is not None:
        size += len(prompt) if isinstance(prompt, str) else len(prompt)
    for message in request.messages or ():
        size += MESSAGE_CHARS + len(message.content) + len(message.reasoning or "")
        size += sum(len(call.arguments) + len(call.name) for call in message.tool_calls)
        if size >= enough:
            return size
    for tool in request.tools:
        size += TOOL_CHARS + len(tool.name) + len(tool.description) + _json_chars(tool.parameters)
        if size >= enough:
            return size
    return size


def texts_chars(texts: Sequence[str]) -> int:
    """Rule 1: about what tokenizing each of `texts` by itself costs, in characters."""
    return sum(len(text) for text in texts) + TEXT_CHARS * len(texts)


def _json_chars(value: object) -> int:
    try:
        return len(_ENCODE.encode(value))
    except (TypeError, ValueError, RecursionError):  # refused later, by name; large meanwhile
        return OFFLOAD_CHARS


class Offload:
    """Rule 2's switch and its thread limit; one per app (the Frontend)."""

    def __init__(self, threshold: int = OFFLOAD_CHARS, max_threads: int = OFFLOAD_THREADS) -> None:
        self.threshold = threshold
        self._limiter = anyio.CapacityLimiter(max_threads)

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        if size < self.threshold:
            return fn(*args)
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
