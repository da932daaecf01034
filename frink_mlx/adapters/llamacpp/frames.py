"""llama.cpp /completion and /infill responses: events -> frames and the final object.

Pure functions over core events, no I/O. What llama.cpp's editor plugins and
its own server tests read:
1. Non-streaming: one object with `content`, `tokens` (the generated ids when
   `return_tokens`, else []), `stop: true`, `stop_type` (eos / word / limit /
   none), `stopping_word`, `tokens_predicted`, `tokens_evaluated`,
   `tokens_cached`, `generation_settings`, `timings`, `truncated`, `model`,
   `id_slot`, `index`, `has_new_line` and `prompt` (a text prompt only).
2. Streaming: `data: {"content", "tokens", "stop": false, "tokens_predicted",
   "tokens_evaluated", ...}` per text piece -- `tokens` holds the piece's ids,
   with or without `return_tokens`, as llama-server sends them -- then one final
   frame with `stop: true` and everything of rule 1 (content ""); no `[DONE]`.
3. `timings`: `prompt_n` = prompt tokens computed (not read from the prefix
   cache), `cache_n` = tokens read from it, `prompt_ms` = time to the first
   token; `predicted_n` = tokens generated, `predicted_ms` = time from the first
   token to the last. The decode rates divide by the `predicted_n - 1` tokens
   that `predicted_ms` covers -- the first token came out of the prefill and is
   priced in `prompt_ms` -- so `n_predict: 1` reports 0 (no decode step measured)
   instead of a rate of thousands per second.
4. `n_probs` > 0: `completion_probabilities` per token, llama.cpp's shape
   `{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}`,
   in each stream frame for its tokens and in full in the final object.
5. `response_fields` (non-streaming only, as llama-server): the object is cut
   to the listed paths, each a key of the result named by the path itself
   (`"timings/prompt_n"` -> `{"timings/prompt_n": 12}`); unknown paths are left out.
6. A warm-up (`n_predict: 0`) reports no content and `tokens_predicted: 0`:
   the one token its prefill produced is discarded (translate.py rule 1).
7. `truncated` is true when generation stopped because the context was full:
   the length limit was the room left under the context ceiling
   (`context_bound`, serving/handles.py rule 3), not a limit the client set.
8. `index` numbers the results of one request in order, as llama-server does:
   the completions of the first prompt (`n_cmpl` of them), then the next
   prompt's (translate.py rules 7 and 9).
"""

from __future__ import annotations

from typing import Any, Callable

from ...core.events import Done, ErrorEvent, Event, TextDelta, TokenLogprob


def stop_type(done: Done) -> str:
    return {"eos": "eos", "stop_sequence": "word", "length": "limit"}.get(done.stop_kind, "none")


def timings(done: Done, predicted_n: int | None = None) -> dict[str, float]:
    """Rule 3, from Done.timings (prompt_ms, predicted_ms) and its usage; `draft_n` /
    `draft_n_accepted` only when drafts were made (llama-server adds them only then)."""
    usage = done.usage
    cache_n = usage.cached_tokens
    prompt_n = usage.prompt_tokens - cache_n
    prompt_ms = float(done.timings.get("prompt_ms", 0.0))
    predicted_ms = float(done.timings.get("predicted_ms", 0.0))
    n = usage.completion_tokens if predicted_n is None else predicted_n
    decoded = max(0, n - 1)
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / decoded if decoded and predicted_ms else 0.0,
            "predicted_per_second": 1e3 * decoded / predicted_ms if decoded and predicted_ms
            else 0.0,
            **({"draft_n": usage.draft_tokens, "draft_n_accepted": usage.draft_accepted or 0}
               if usage.draft_tokens else {})}


def probability(lp: TokenLogprob) -> dict[str, Any]:
    """Rule 4: one token's entry."""
    return {"id": lp.token_id, "token": lp.token, "bytes": lp.bytes or list(lp.token.encode()),
            "logprob": lp.logprob,
            "top_logprobs": [{"id": t.token_id, "token": t.token,
                              "bytes": t.bytes or list(t.token.encode()), "logprob": t.logprob}
                             for t in lp.top]}


def project(result: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """Rule 5: `body` cut to the `response_fields` paths, each keyed by the path itself."""
    out: dict[str, Any] = {}
    for path in paths:
        node: Any = result
        for key in path.split("/"):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            out[path] = node
    return out


class CompletionBuilder:
    """Events of one choice -> llama.cpp stream frames and the final object.

    `output_ids` reads the ids generated so far (the Run's), for `tokens` and
    the running `tokens_predicted`; `settings` is the request's
    `generation_settings`.
    """

    def __init__(self, model: str, prompt: str | None = None, *, prompt_tokens: int = 0,
                 settings: dict[str, Any] | None = None, n_probs: int = 0,
                 return_tokens: bool = False, warmup: bool = False,
                 output_ids: Callable[[], list[int]] | None = None,
                 context_bound: bool = False, first_index: int = 0) -> None:
        self.model = model
        self.prompt = prompt
        self.prompt_tokens = prompt_tokens
        self.settings = settings or {}
        self.n_probs = n_probs
        self.return_tokens = return_tokens
        self.warmup = warmup
        self.output_ids = output_ids or (lambda: [])
        self.context_bound = context_bound
        self.first_index = first_index   # rule 8: the run's place among several prompts
        self.content: list[str] = []
        self.probs: list[dict[str, Any]] = []
        self.done: Done | None = None
        self._sent_ids = 0

    def _new_ids(self) -> list[int]:
        ids = self.output_ids()
        new, self._sent_ids = ids[self._sent_ids:], len(ids)
        return new   # rule 2: a stream frame names its ids whether or not `return_tokens`

    def start(self) -> list[dict[str, Any]]:
        return []

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            if not event.text or self.warmup:
                return []
            self.content.append(event.text)
            frame: dict[str, Any] = {
                "content": event.text, "tokens": self._new_ids(), "stop": False, "id_slot": 0,
                "index": self.first_index + event.index,
                "tokens_predicted": len(self.output_ids()),
                "tokens_evaluated": self.prompt_tokens}
            if self.n_probs:
                probs = [probability(lp) for lp in event.logprobs]
                self.probs.extend(probs)
                frame["completion_probabilities"] = probs
            return [frame]
        if isinstance(event, Done):
            self.done = event
            return [{"content": "", "tokens": self._new_ids(), **self.final_fields(event)}]
        if isinstance(event, ErrorEvent):
            return [{"error": {"code": event.status, "message": event.message,
                               "type": "server_error"}}]
        return []

    def final_fields(self, done: Done) -> dict[str, Any]:
        """Rule 1's fields, minus `content` and `tokens`."""
        kind = stop_type(done)
        predicted = 0 if self.warmup else done.usage.completion_tokens
        out = {"stop": True, "model": self.model, "id_slot": 0,
               "index": self.first_index + done.index,
               "stop_type": kind,
               "stopping_word": (done.stop_sequence or "") if kind == "word" else "",
               "tokens_predicted": predicted,
               "tokens_evaluated": done.usage.prompt_tokens,
               "tokens_cached": done.usage.cached_tokens,
               "truncated": kind == "limit" and self.context_bound,   # rule 7
               "has_new_line": False,
               "generation_settings": self.settings, "timings": timings(done, predicted),
               **({"prompt": self.prompt} if self.prompt is not None else {})}
        return out

    def end(self) -> list[dict[str, Any]]:
        return []   # the final frame went out with Done

    def result(self, response_fields: list[str] | None = None) -> dict[str, Any]:
        if self.done is None:
            raise RuntimeError("result() before Done")
        text = "".join(self.content)
        ids = [] if self.warmup or not self.return_tokens else self.output_ids()
        fields = self.final_fields(self.done)
        fields["has_new_line"] = "\n" in text
        result = {"content": text, "tokens": ids, **fields}
        if self.n_probs:
            result["completion_probabilities"] = self.probs
        return project(result, response_fields) if response_fields else result
