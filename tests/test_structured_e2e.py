"""Structured output end to end: real HTTP, real app, real engine, official SDKs.

Two servers: the tiny random-weight llama (fast: refusals, grammars, per-row
dead ends) and the default model, SmolLM2-135M from its GGUF (slow: the 20
schemas, the SDK `parse()` helpers, the mixed batch). The slow tests keep
`max_tokens` modest and schemas small: the model decodes ~10-15 tok/s here.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

# --- the 20 small schemas (with prompts the 135M model can answer) ----------------

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required,
            "additionalProperties": False}


SCHEMAS: list[tuple[str, str, dict[str, Any]]] = [
    ("person", "Give me a person with a name and an age as JSON.", PERSON),
    ("bool_flag", "Is the sky blue? Answer as JSON with field answer.",
     _obj({"answer": {"type": "boolean"}})),
    ("color_enum", "Pick a primary color.", _obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("int_bounds", "Pick a number between 1 and 10.",
     _obj({"n": {"type": "integer", "minimum": 1, "maximum": 10}})),
    ("neg_int", "Give a temperature below zero in Celsius.",
     _obj({"celsius": {"type": "integer", "minimum": -50, "maximum": -1}})),
    ("number", "How much does a cup of coffee cost in dollars?",
     _obj({"price": {"type": "number", "minimum": 0, "maximum": 100}})),
    ("zip_pattern", "Give a US zip code.",
     _obj({"zip": {"type": "string", "pattern": "^[0-9]{5}$"}})),
    ("date_pattern", "When is New Year's Day 2025? Use YYYY-MM-DD.",
     _obj({"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}})),
    ("string_array", "List three fruits.",
     {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}),
    ("int_array", "List the first four even numbers.",
     {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100},
      "minItems": 1, "maxItems": 5}),
    ("enum_array", "Which of these are warm colors: red, blue, orange?",
     {"type": "array", "items": {"enum": ["red", "blue", "orange"]}, "minItems": 1, "maxItems": 3}),
    ("nested", "Describe a book with a title and its author's name.",
     _obj({"title": {"type": "string", "maxLength": 30},
           "author": _obj({"name": {"type": "string", "maxLength": 30}})})),
    ("array_of_objects", "List two cities with their countries.",
     _obj({"cities": {"type": "array", "minItems": 2, "maxItems": 2,
                      "items": _obj({"city": {"type": "string", "maxLength": 20},
                                     "country": {"type": "string", "maxLength": 20}})}})),
    ("nullable", "Give a middle name if there is one.",
     _obj({"middle_name": {"type": ["string", "null"], "maxLength": 15}})),
    ("any_of", "Give an id, either a number or a short code.",
     _obj({"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9999},
                            {"type": "string", "pattern": "^[A-Z]{3}$"}]}})),
    ("const", "Return the status.",
     _obj({"status": {"const": "ok"}, "code": {"type": "integer", "minimum": 200, "maximum": 599}})),
    ("defs_ref", "Give a point with x and y coordinates.",
     {"$defs": {"coord": {"type": "integer", "minimum": -100, "maximum": 100}},
      **_obj({"x": {"$ref": "#/$defs/coord"}, "y": {"$ref": "#/$defs/coord"}})}),
    ("optional_props", "Describe a car's make.",
     _obj({"make": {"type": "string", "maxLength": 15},
           "year": {"type": "integer", "minimum": 1900, "maximum": 2030}}, required=["make"])),
    ("tuple", "Give a name and an age.",
     {"type": "array", "prefixItems": [{"type": "string", "maxLength": 15},
                                       {"type": "integer", "minimum": 0, "maximum": 120}],
      "items": False, "minItems": 2}),
    ("email_pattern", "Give an example email address.",
     _obj({"email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"}})),
]


def _settings(root: Path, toml: str) -> Settings:
    (root / "models.toml").write_text(toml)
    return Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                         access_log=False, cache_dir=str(root / "cache"))


def _serve(settings: Settings) -> Any:
    from daemon_support import generation_factory, start_server

    return start_server(create_app(settings, registry=load_registry(settings),
                                   factory=generation_factory()))


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("structured_tiny")
    server = _serve(_settings(root, f'default = "tiny"\n\n[models.tiny]\nsource = "{tiny_llama_dir}"\n'))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def smol(smollm2_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("structured_smol")
    server = _serve(_settings(root, f'default = "smol"\n\n[models.smol]\nsource = "{smollm2_gguf_path}"\n'))
    yield server
    server.stop()


def _client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)


def _schema_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _chat(client: openai.OpenAI, prompt: str, max_tokens: int, **kw: Any) -> Any:
    return client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": prompt}],
        temperature=0, max_tokens=max_tokens, **kw)


# --- fast: refusals before any byte, grammars on the tiny model --------------------

@pytest.mark.parametrize("fmt, needle", [
    (_schema_format("u", {"type": "array", "uniqueItems": True}), "uniqueItems"),
    (_schema_format("t", {"type": "objectx"}), "objectx"),
    (_schema_format("r", {"$ref": "#/$defs/nope"}), "nope"),
    (_schema_format("n", {"not": {"type": "string"}}), "not"),
])
def test_bad_schema_is_400_naming_the_problem(tiny: Any, fmt: dict[str, Any], needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _chat(_client(tiny), "hi", 8, response_format=fmt)
    assert needle in str(info.value.body)


def test_bad_schema_in_a_stream_is_400_before_any_sse_header(tiny: Any) -> None:
    body = {"model": "default", "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": _schema_format("u", {"type": "array", "uniqueItems": True})}
    r = httpx.post(tiny.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    assert "uniqueItems" in r.json()["error"]["message"]


def test_llamacpp_bad_gbnf_and_bad_regexless_schema_are_400(tiny: Any) -> None:
    r = httpx.post(tiny.url + "/completion", timeout=60,
                   json={"prompt": "x", "n_predict": 4, "grammar": "root ::= missing_rule"})
    assert r.status_code == 400 and "missing_rule" in r.text
    r = httpx.post(tiny.url + "/completion", timeout=60,
                   json={"prompt": "x", "n_predict": 4, "stream": True,
                         "json_schema": {"type": "string", "pattern": "[a-z"}})
    assert r.status_code == 400 and "text/event-stream" not in r.headers["content-type"]


def test_responses_bad_text_format_is_400(tiny: Any) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        _client(tiny).responses.create(
            model="default", input="hi", max_output_tokens=8,
            text={"format": {"type": "json_schema", "name": "x", "strict": True,
                             "schema": {"type": "object", "properties": {"a": {"type": 7}}}}})
    assert "#/properties/a/type" in str(info.value.body)


def test_unknown_forced_tool_is_400(tiny: Any) -> None:
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="tool_choice.*'b'"):
        _chat(_client(tiny), "hi", 8, tools=[tool],
              tool_choice={"type": "function", "function": {"name": "b"}})


def test_gbnf_grammar_constrains_even_a_random_model(tiny: Any) -> None:
    for grammar in ('root ::= "yes" | "no"', 'root ::= [0-9] [0-9] "-" [a-c]'):
        r = httpx.post(tiny.url + "/completion", timeout=120,
                       json={"prompt": "The answer:", "n_predict": 16, "temperature": 0,
                             "grammar": grammar})
        assert r.status_code == 200, r.text
        content = r.json()["content"]
        if "yes" in grammar:
            assert content in ("yes", "no")
        else:
            assert len(content) == 4 and content[:2].isdigit() and content[2] == "-"


def test_json_schema_on_a_random_model_stays_valid_or_is_cut_by_length(tiny: Any) -> None:
    schema = _obj({"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}})
    out = _chat(_client(tiny), "hi", 20, response_format=_schema_format("s", schema))
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), schema)
    cut = _chat(_client(tiny), "hi", 3, response_format=_schema_format("s", schema))
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.choices[0].message.content)


def test_a_dead_end_ends_only_its_own_row(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A matcher that dead-ends mid-row (forced here: its mask empties after 3
    tokens) fails that request with a clear error; a row decoding beside it
    in the same batch is untouched (equal to its solo greedy output)."""
    import frink_mlx.engine.constraints as constraints

    class DeadEndAfter:
        def __init__(self, inner: Any, after: int) -> None:
            self.inner, self.after, self.num = inner, after, 0

        def allowed_mask(self) -> Any:
            mask = self.inner.allowed_mask()
            return mask if self.num < self.after else mask & False

        def accept(self, token_id: int) -> bool:
            self.num += 1
            return self.num <= self.after and self.inner.accept(token_id)

        def is_done(self) -> bool:
            return self.inner.is_done()

        @property
        def error(self) -> str | None:
            return "Structured output failed: dead end" if self.num > self.after else None

    real_build = constraints.build_constraints

    async def build(req: Any, markup: Any, compiler: Any) -> Any:
        rows = await real_build(req, markup, compiler)
        if req.response_format is not None and req.response_format.name == "dead_end":
            rows = [DeadEndAfter(r, 3) for r in rows]
        return rows

    monkeypatch.setattr(constraints, "build_constraints", build)
    client = _client(tiny)
    solo = _chat(client, "The weather", 12).choices[0].message.content
    body = {"model": "default", "max_tokens": 12, "temperature": 0, "stream": True,
            "messages": [{"role": "user", "content": "x"}],
            "response_format": _schema_format("dead_end", {"type": "string", "maxLength": 40})}
    with ThreadPoolExecutor(2) as pool:
        failing = pool.submit(httpx.post, tiny.url + "/v1/chat/completions", json=body, timeout=120)
        plain = pool.submit(lambda: _chat(client, "The weather", 12).choices[0].message.content)
        assert plain.result() == solo
        r = failing.result()
    assert r.status_code == 200  # the failure came mid-stream, after the header
    assert "dead end" in r.text and '"error"' in r.text


# --- slow: the default model ------------------------------------------------------

@pytest.mark.slow
def test_twenty_schemas_validate_with_the_default_model(smol: Any) -> None:
    client = _client(smol)

    def one(item: tuple[str, str, dict[str, Any]]) -> tuple[str, Any, dict[str, Any]]:
        name, prompt, schema = item
        return name, _chat(client, prompt, 64, response_format=_schema_format(name, schema)), schema

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, SCHEMAS))
    assert len({name for name, _, _ in results}) == 20
    for name, out, schema in results:
        choice = out.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


class Pet(BaseModel):
    name: str = Field(max_length=16)
    species: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


@pytest.mark.slow
def test_sdk_parse_helpers_with_a_pydantic_model(smol: Any) -> None:
    client = _client(smol)
    messages = [{"role": "user", "content": "Describe a pet as JSON."}]
    parsed = client.chat.completions.parse(model="default", messages=messages,  # type: ignore[arg-type]
                                           response_format=Pet, temperature=0, max_tokens=48)
    pet = parsed.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.species in ("cat", "dog", "fish")
    resp = client.responses.parse(model="default", input="Describe a pet as JSON.",
                                  text_format=Pet, temperature=0, max_output_tokens=48)
    assert isinstance(resp.output_parsed, Pet)


@pytest.mark.slow
def test_json_mode_stream_and_llamacpp_schema(smol: Any) -> None:
    client = _client(smol)
    chunks = _chat(client, "Describe a cat in JSON.", 40, stream=True,
                   response_format={"type": "json_object"})
    text, finish = "", None
    for chunk in chunks:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert finish == "length"
    r = httpx.post(smol.url + "/completion", timeout=300, json={
        "prompt": "A person as JSON: ", "n_predict": 48, "temperature": 0, "json_schema": PERSON})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["content"]), PERSON)


@pytest.mark.slow
def test_a_cut_json_reports_length(smol: Any) -> None:
    out = _chat(_client(smol), SCHEMAS[0][1], 4, response_format=_schema_format("p", PERSON))
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.choices[0].message.content)


MIXED_PROMPTS = ["What is the capital of France?", "Name a color.",
                 "Say hello in Spanish.", "Count to five."]


@pytest.mark.slow
def test_mixed_batch_constrained_rows_valid_unconstrained_rows_unchanged(smol: Any) -> None:
    client = _client(smol)
    solo = [_chat(client, p, 16).choices[0].message.content for p in MIXED_PROMPTS]
    constrained = [SCHEMAS[i] for i in (0, 2, 6, 12)]
    barrier = threading.Barrier(8)

    def plain(prompt: str) -> str:
        barrier.wait()
        return _chat(client, prompt, 16).choices[0].message.content

    def shaped(item: tuple[str, str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        name, prompt, schema = item
        barrier.wait()
        out = _chat(client, prompt, 64, response_format=_schema_format(name, schema))
        return out.choices[0].message.content, schema

    with ThreadPoolExecutor(8) as pool:
        shaped_f = [pool.submit(shaped, item) for item in constrained]
        plain_f = [pool.submit(plain, p) for p in MIXED_PROMPTS]
        for f in shaped_f:
            text, schema = f.result()
            jsonschema.validate(json.loads(text), schema)
        assert [f.result() for f in plain_f] == solo


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.", "strict": True,
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"type": "string"},
                                  "unit": {"type": "string", "enum": ["C", "F"]}}}}}


# an agent's second turn: one call already made and answered, so a small model calls again
WEATHER_TURNS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris right now?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees, sunny"},
    {"role": "assistant", "content": "It is 22 degrees and sunny in Paris."},
    {"role": "user", "content": "And in Berlin?"},
]


@pytest.mark.slow
def test_strict_tools_hold_their_schema_over_24_sampled_seeds(smol: Any) -> None:
    """openai-agents' request (a strict function tool) replayed over 24 seeds at temperature
    1, under tool_choice auto (SmolLM2 mostly answers in text there) and required: every
    call parses and fits the schema, and no call markup leaks into arguments or text, also
    when max_tokens cuts a call short."""
    client = _client(smol)

    def one(seed: int) -> Any:
        return client.chat.completions.create(
            model="default", tools=[WEATHER_TOOL], messages=WEATHER_TURNS,  # type: ignore[list-item]
            tool_choice="auto" if seed % 2 else "required",
            temperature=1.0, seed=seed, max_tokens=12 if seed % 6 == 0 else 48)

    with ThreadPoolExecutor(4) as pool:
        choices = [r.choices[0] for r in pool.map(one, range(24))]
    schema = WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    calls = 0
    for choice in choices:
        text = choice.message.content or ""
        assert "tool_call" not in text, text
        for call in choice.message.tool_calls or []:
            assert "tool_call" not in call.function.arguments, call.function.arguments
            if choice.finish_reason == "tool_calls":
                calls += 1
                assert call.function.name == "get_weather"
                jsonschema.validate(json.loads(call.function.arguments), schema)
    assert calls >= 8, [(c.finish_reason, c.message.content) for c in choices]
