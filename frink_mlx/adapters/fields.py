"""The field policy of every route, in one table: what each request field does here.

Why one table: clients send what their authors saw in the upstream API, and a
daemon that refuses what it does not know breaks them on their first request
(issue 23), while one that silently ignores a field that changes the answer
misleads them. Each declared field gets exactly one treatment:

    honoured   the field does what the upstream API says
    extension  a frink (or vLLM / llama-server) addition beyond the upstream API
    no-op      accepted and ignored because ignoring it cannot change what the
               client gets (the note says why)
    refused    400 `unsupported_field` naming it, when set to anything but its
               neutral value: ignoring it would silently change the answer

Fields that no wire struct declares are *unknown*: accepted, listed in the
`x-frink-ignored-fields` response header and a log line, or refused under
`--strict-fields` (http/fields.py). tests/adapters/test_field_policy.py holds
this table to the wire structs (every declared top-level field has a row,
every row names a real field) and the README's table to `markdown()`
(regenerate it with `python scripts/regen_field_table.py`).
"""

from __future__ import annotations

from typing import Any

from ..core.checks import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_TOOLS
from .anthropic import wire as anthropic_wire
from .llamacpp import wire as llamacpp_wire
from .openai import responses_wire
from .openai import wire as openai_wire
from .openai.embeddings import EmbeddingsRequest

Rule = tuple[str, str]   # (treatment, note)
H, E, N, R = "honoured", "extension", "no-op", "refused"
# core/checks.py rule 4, the same on every protocol
STOPS = f"at most {MAX_STOP_SEQUENCES}, each at most {MAX_STOP_CHARS} characters"
TOOLS = f"at most {MAX_TOOLS}"

_OPENAI_SAMPLING: dict[str, Rule] = {
    "model": (H, "registry name or alias; null = default; unknown names fall back (README)"),
    "max_tokens": (H, "-1 = no limit (up to the context ceiling)"),
    "temperature": (H, ""), "top_p": (H, ""), "seed": (H, ""), "stop": (H, STOPS),
    "presence_penalty": (H, ""), "frequency_penalty": (H, ""),
    "logit_bias": (H, f"token ids of the model; at most {MAX_LOGIT_BIAS}"),
    "n": (H, ""), "stream": (H, ""), "stream_options": (H, "include_usage"),
    "logprobs": (H, ""),
    "user": (N, "an end-user id for the client's own records"),
    "top_k": (E, ""), "min_p": (E, ""), "repetition_penalty": (E, ""),
    "ignore_eos": (E, "vLLM's: generation goes on past an end-of-generation token"),
    "cache_salt": (E, "separates prefix-cache entries"),
    "speculative": (E, "false opts out of speculative decoding; the answer is the same"),
    "n_predict": (E, "llama-server: the length limit; 0 = one-token warm-up"),
    "cache_prompt": (E, "llama-server: false bypasses the prefix cache"),
    "grammar": (E, "llama-server: GBNF, enforced (invalid = 400)"),
    "json_schema": (E, "llama-server: JSON Schema, enforced"),
    "store": (N, "nothing is stored for chat/completions; the answer is the same"),
    "metadata": (N, "tags for stored completions; nothing is stored"),
    "service_tier": (N, "one local tier"),
    "prompt_cache_key": (N, "the prefix cache needs no key"),
    "prompt_cache_retention": (N, "cached prefixes live until evicted"),
    "safety_identifier": (N, "an end-user id for abuse tracking"),
    "verbosity": (N, "a hint a local model has no knob for"),
    "id_slot": (N, "llama-server: one shared prefix cache, no slots to pin"),
    "samplers": (N, "llama-server: sampler order; ours is fixed (penalties, top-k, top-p, "
                 "min-p, temperature)"),
    "t_max_prompt_ms": (N, "llama-server: time budget, not enforced"),
    "t_max_predict_ms": (E, "llama-server: after a newline, the answer ends once this many ms "
                         "have passed since its first token"),
    "n_indent": (E, "llama-server: the first later line indented less ends the answer"),
    "response_fields": (N, "llama-server: honoured on /completion and /infill only"),
    "best_of": (R, "unless equal to n"), "suffix": (R, "no fill-in-the-middle here; use /infill"),
    "functions": (R, "deprecated; use tools"), "function_call": (R, "deprecated; use tool_choice"),
    "audio": (R, "text only"), "modalities": (R, "unless [\"text\"]"),
    "prediction": (R, ""), "web_search_options": (R, ""),
}

CHAT: dict[str, Rule] = {
    **_OPENAI_SAMPLING,
    "messages": (H, "text and image_url parts (data: URLs; read by vision models, a "
                 "placeholder text on text-only ones unless refuse_images); audio refused"),
    "max_completion_tokens": (H, "-1 = no limit"),
    "top_logprobs": (H, ""),
    "tools": (H, f"function tools; strict schemas enforced; {TOOLS}"),
    "tool_choice": (H, "auto / none / required / a function (forced calls are grammar-bound)"),
    "parallel_tool_calls": (H, "false: the turn ends after the first complete call"),
    "response_format": (H, "json_object, json_schema; llama-server's `schema` too"),
    "reasoning_effort": (H, "none/minimal turn thinking off, others on; low/medium/high "
                         "reach a template reading reasoning_effort (gpt-oss)"),
    "chat_template_kwargs": (E, "keys the model's chat template reads (e.g. preserve_thinking, "
                             "reasoning_effort); other keys refused by name"),
    "add_generation_prompt": (E, "true together with continue_final_message = 400"),
    "continue_final_message": (E, ""),
}

COMPLETIONS: dict[str, Rule] = {
    **_OPENAI_SAMPLING,
    "prompt": (H, "text, token ids, or a batch of either (at most max_batch choices in "
               "all, prompts times n)"),
    "echo": (H, "not with logprobs"),
    "logprobs": (H, "0..5 alternatives"),
}

RESPONSES: dict[str, Rule] = {
    "model": _OPENAI_SAMPLING["model"],
    "input": (H, "message, function_call, function_call_output, custom_tool_call, "
              "custom_tool_call_output, reasoning items; input_image parts read by vision "
              "models, a placeholder text on text-only ones (refuse_images refuses); "
              "input_file refused"),
    "instructions": (H, ""),
    "tools": (H, "function; namespace (members offered as `ns__name`); custom (one string "
              "input; a lark or regex grammar enforced on it with JSON tool-call markup, "
              "else noted in x-frink-ignored-fields); "
              f"tool_search; hosted tools dropped, listed in x-frink-ignored-fields; {TOOLS}"),
    "tool_choice": (H, ""),
    "max_output_tokens": (H, ""), "temperature": (H, ""), "top_p": (H, ""),
    "reasoning": (H, "effort on/off; summary other than auto/none refused (raw reasoning "
                  "text is returned)"),
    "store": (H, "kept in memory for previous_response_id and GET"),
    "previous_response_id": (H, ""), "stream": (H, ""),
    "metadata": (H, "echoed"), "parallel_tool_calls": (H, "false: ends after the first call"),
    "text": (H, "format json_object/json_schema enforced"),
    "text.verbosity": (N, "a hint a local model has no knob for"),
    "user": (N, "an end-user id"), "truncation": (H, "disabled only"),
    "include": (N, "items naming output never produced here (reasoning.encrypted_content, "
                "hosted-tool results); message.output_text.logprobs refused by name"),
    "prompt_cache_key": (N, "the prefix cache needs no key"),
    "prompt_cache_retention": (N, "cached prefixes live until evicted"),
    "safety_identifier": (N, "an end-user id"), "service_tier": (N, "one local tier"),
    "stream_options": (N, "obfuscation padding is never added"),
    "client_metadata": (N, "Codex's client tags; nothing reads them"),
    "background": (R, "when true"), "conversation": (R, "use previous_response_id"),
    "prompt": (R, "stored prompt templates"), "top_logprobs": (R, "when > 0"),
    "max_tool_calls": (R, ""),
}

EMBEDDINGS: dict[str, Rule] = {
    "input": (H, "text, texts; token ids only with native_token_ids"),
    "model": (H, "encoder, or a chat model's side-car; unknown names fall back"),
    "encoding_format": (H, "float, base64"),
    "dimensions": (H, "full width, or shorter for Matryoshka encoders"),
    "user": (N, "an end-user id"),
    "truncate": (E, "cut over-long inputs instead of a 400"),
    "native_token_ids": (E, "the ids in input are this model's own (from /tokenize); "
                         "without it token-id input is refused (LangChain sends tiktoken ids)"),
    "pooling": (R, "each model pools as trained"),
}

MESSAGES: dict[str, Rule] = {
    "model": (H, "unknown names (claude-...) fall back"), "max_tokens": (H, ""),
    "messages": (H, "text, tool_use, tool_result, thinking blocks; role system where it "
                 "stands; images read by vision models, a placeholder text on text-only ones; "
                 "documents refused"),
    "system": (H, "string or text blocks; Claude Code's billing-header line dropped"),
    "stop_sequences": (H, STOPS), "stream": (H, ""),
    "temperature": (H, ""), "top_p": (H, ""), "top_k": (H, ""),
    "tools": (H, "client tools; server tools refused by name; defer_loading ones kept out "
              f"of the prompt until a tool_reference loads them; {TOOLS}"), "tool_choice": (H, ""),
    "thinking": (H, "enabled (budget enforced), adaptive, disabled; display summarized/"
                 "updates a no-op, omitted leaves the text out"),
    "context_management": (H, "clear_thinking edits (keep the last N turns' reasoning); "
                           "clear_tool_uses refused"),
    "speculative": (E, "frink: false opts out of speculative decoding; the answer is the same"),
    "metadata": (N, "user_id is an end-user id"),
    "output_config": (H, "format json_schema enforced; effort low/medium bound the "
                      "thinking (1,024 / 4,096 tokens)"),
    "cache_control": (N, "every prefix is cached automatically"),
    "service_tier": (N, "one local tier"),
    "container": (R, "no server-side code execution"),
    "mcp_servers": (R, "no server-side MCP connector"),
}

_LLAMACPP_SAMPLING: dict[str, Rule] = {
    "model": (E, "llama-server serves one model; absent = default"),
    "n_predict": (H, "-1 = until EOS/ceiling; 0 = warm-up: prefill into the prefix cache, "
                  "no tokens returned"),
    "temperature": (H, ""), "top_k": (H, ""), "top_p": (H, ""), "min_p": (H, ""),
    "repeat_penalty": (H, ""), "repeat_last_n": (H, ""), "presence_penalty": (H, ""),
    "frequency_penalty": (H, ""), "seed": (H, ""), "stop": (H, STOPS), "stream": (H, ""),
    "cache_prompt": (H, "false bypasses the prefix cache"),
    "ignore_eos": (H, "end-of-generation tokens banned (logit bias -inf), as llama-server"),
    "speculative": (E, "frink: false opts out of speculative decoding; the answer is the same"),
    "n_probs": (H, "completion_probabilities"), "return_tokens": (H, "tokens"),
    "json_schema": (H, "enforced"), "grammar": (H, "GBNF, enforced; invalid = 400"),
    "logit_bias": (H, "ids, or texts (the bias applies to each of their tokens); at most "
                   f"{MAX_LOGIT_BIAS} entries, before and after tokenizing"),
    "response_fields": (H, "non-streaming: the result cut to these paths"),
    "id_slot": (N, "one shared prefix cache, no slots to pin"),
    "n_indent": (H, "the first later line indented less ends the completion, cut after "
                 "its indentation"),
    "t_max_prompt_ms": (N, "time budget not enforced (llama.vim: not yet supported upstream)"),
    "t_max_predict_ms": (H, "after a newline, the completion ends once this many ms have "
                         "passed since its first token (stop_type limit)"),
    "samplers": (N, "sampler order is fixed (penalties, top-k, top-p, min-p, temperature)"),
    "n_keep": (N, "the context is never shifted"), "min_keep": (N, ""),
    "timings_per_token": (N, "timings come with the final frame"),
    "mirostat": (R, "unless 0"), "typical_p": (R, "unless 1"), "dynatemp_range": (R, "unless 0"),
    "xtc_probability": (R, "unless 0"), "dry_multiplier": (R, "unless 0"),
    "top_n_sigma": (R, "unless -1"), "lora": (R, ""),
    "n_cmpl": (H, "1-4 completions, answered as an array (not with stream)"),
    "post_sampling_probs": (R, "unless false"),
}

COMPLETION: dict[str, Rule] = {
    **_LLAMACPP_SAMPLING,
    "prompt": (H, "text, token ids, a mix, {prompt_string, multimodal_data} objects (base64 "
               "images at <__media__> markers: read by vision models, a placeholder text on "
               "text-only ones), or several prompts (an array of results; not with stream; at "
               "most max_batch results in all)")}
INFILL: dict[str, Rule] = {
    **_LLAMACPP_SAMPLING,
    "input_prefix": (H, ""), "input_suffix": (H, ""), "prompt": (H, "after the FIM middle"),
    "input_extra": (H, "chunks before the prefix (filename, text)"),
    "input_extra[].time": (N, "llama.vim's chunk timestamp"),
}
TOKENIZE: dict[str, Rule] = {
    "content": (H, ""), "add_special": (H, ""), "with_pieces": (H, ""),
    "parse_special": (R, "false (special-token text is always parsed)"), "model": (E, ""),
}
DETOKENIZE: dict[str, Rule] = {"tokens": (H, ""), "model": (E, "")}

# route -> (wire struct, rules)
POLICY: dict[str, tuple[Any, dict[str, Rule]]] = {
    "POST /v1/chat/completions, /chat/completions": (openai_wire.ChatCompletionRequest, CHAT),
    "POST /v1/completions": (openai_wire.CompletionRequest, COMPLETIONS),
    "POST /v1/responses": (responses_wire.ResponsesRequest, RESPONSES),
    "POST /v1/embeddings, /embeddings": (EmbeddingsRequest, EMBEDDINGS),
    "POST /v1/messages (+ /count_tokens)": (anthropic_wire.MessagesRequest, MESSAGES),
    "POST /completion, /completions": (llamacpp_wire.CompletionRequest, COMPLETION),
    "POST /infill": (llamacpp_wire.InfillRequest, INFILL),
    "POST /tokenize": (llamacpp_wire.TokenizeRequest, TOKENIZE),
    "POST /detokenize": (llamacpp_wire.DetokenizeRequest, DETOKENIZE),
}

BEGIN = "<!-- field-table: generated by `python -m frink_mlx.adapters.fields` -->"
END = "<!-- /field-table -->"


def markdown() -> str:
    """The README's field table, between BEGIN and END: one row per route and field."""
    lines = [BEGIN, "", "| route | field | treatment | why / how |", "|---|---|---|---|"]
    order = {H: 0, E: 1, N: 2, R: 3}
    for route, (_, rules) in POLICY.items():
        rows = sorted(rules.items(), key=lambda item: (order[item[1][0]], item[0]))
        for k, (name, (kind, note)) in enumerate(rows):
            lines.append(f"| {route if k == 0 else ''} | `{name}` | {kind} | {note} |")
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
