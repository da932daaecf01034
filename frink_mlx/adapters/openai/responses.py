"""OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

The daemon helper's adapters/openai/__init__.py includes `routes` from here.
Request rules (responses_wire.py has the decoding rules):
1. `input` as a string is one user message. As items: `message` (roles
   developer/system -> system), `function_call`, `function_call_output`,
   `reasoning`, `custom_tool_call`, `custom_tool_call_output` (tools:
   responses_tools.py). Consecutive assistant-side items (reasoning, message,
   function_call) merge into one assistant turn, which is how chat templates
   expect tool calls; `function_call_output` becomes a `tool` message naming
   the call and its tool.
2. `instructions` becomes the leading system message for this request only.
3. `previous_response_id` prepends the stored conversation of that response
   (its input and output); an unknown id is a 404 naming it.
4. `reasoning.effort` "none"/"minimal" turns thinking off, any other effort on
   (and low/medium/high reach a template that reads `reasoning_effort`, gpt-oss's);
   reasoning comes back as raw `reasoning_text`, never as a summary, so
   `summary` other than "auto"/"none" is refused by name.
5. `text.format` json_object/json_schema becomes the structured-output
   constraint; `parallel_tool_calls: false` keeps only the first call the
   model makes (the parser drops the rest).
6. With `store` (the API's default true) the finished response is kept in a
   bounded in-memory store (serving/responses_store.py) for follow-ups and GET.
7. No-ops, accepted because ignoring them cannot change the answer:
   `prompt_cache_key` (the prefix cache needs no key), `safety_identifier`,
   `service_tier`, `client_metadata`, `text.verbosity` (a hint a local model has no knob for),
   and `include` items naming things this server never produces (encrypted
   reasoning, tool-call results of hosted tools, image URLs). Refused by name:
   `include: ["message.output_text.logprobs"]`, `top_logprobs`,
   `max_tool_calls`, `background: true`, `conversation`, `prompt`.
8. `input_image` parts -- in a message, or in a tool's output (Codex's
   `view_image`) -- become a placeholder text where they stood (core/images.py;
   `codex exec -i` puts one in the history, which `codex exec resume` replays);
   `input_file` parts are refused by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...core.events import Done, ErrorEvent, choice_events
from ...core.images import ImageRef, attach_images, from_url, image_part
from ...core.request import GenRequest, Message, ResponseFormat, SamplingParams, ToolCall
from ...errors import InvalidRequest, UnsupportedField
from ...http.body import validation_param
from ...http.errors import endpoint, openai_error
from ...http.fields import report, unknown_fields
from ...http.frontend import frontend
from ...http.sse import sse_frame
from ...serving.responses_store import ResponseStore, StoredResponse
from ..endpoint import Answer, collected, dumps, generate, generating, translated
from . import responses_wire as w
from .chat import OPENAI
from .responses_events import ResponseBuilder, created_now, new_id
from .responses_tools import Offered, custom_arguments, flat_name, note_unheld, offer_tools

if TYPE_CHECKING:
    from ...serving.handles import Run


# -- request -------------------------------------------------------------------
def _part_text(content: str | list[w.ContentPart], where: str, images: list[ImageRef]) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, (w.InputText, w.OutputText)):
            texts.append(part.text)
        elif isinstance(part, w.Refusal):
            texts.append(part.refusal)
        elif isinstance(part, w.InputImage):
            texts.append(image_part(from_url(f"{where}[{j}]", part.image_url), images))
        else:
            raise UnsupportedField(f"{where}[{j}]", "is not text; this server serves text-only "
                                   "models")
    return "".join(texts)


def decode_item(raw: dict[str, Any], i: int, request: Request | None = None) -> Any:
    kind = raw.get("type", "message")
    struct = w.INPUT_ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if struct is None:
        raise UnsupportedField(f"input[{i}].type", f"'{kind}' items are not supported")
    try:
        item = msgspec.convert(raw, struct)
        report(request, unknown_fields(raw, struct, prefix="input[]"))
        return item
    except msgspec.ValidationError as exc:
        inner = validation_param(exc)
        raise InvalidRequest(f"Invalid input item: {exc}",
                             param=f"input[{i}]" + (f".{inner}" if inner else "")) from None


def _assistant_turn(out: list[Message]) -> Message:
    if out and out[-1].role == "assistant":
        return out[-1]
    out.append(Message("assistant"))
    return out[-1]


def input_messages(items: str | list[dict[str, Any]] | None, tool_names: dict[str, str],
                   request: Request | None = None, images: list[ImageRef] | None = None
                   ) -> list[Message]:
    """The Message list `items` stand for; image parts go to `images` (core/images.py)."""
    images = [] if images is None else images
    if items is None:
        raise InvalidRequest("'input' is required.", param="input")
    if isinstance(items, str):
        return [Message("user", items)]
    out: list[Message] = []
    for i, raw in enumerate(items):
        item = decode_item(raw, i, request)
        if isinstance(item, w.MessageItem):
            text = _part_text(item.content, f"input[{i}].content", images)
            if item.role == "assistant":
                turn = _assistant_turn(out)
                turn.content += text
            else:
                out.append(Message("system" if item.role == "developer" else item.role, text))
        elif isinstance(item, (w.FunctionCallItem, w.CustomToolCallItem)):
            name = tool_names[item.call_id] = flat_name(item.namespace, item.name)
            arguments = (item.arguments if isinstance(item, w.FunctionCallItem)
                         else custom_arguments(item.input))
            _assistant_turn(out).tool_calls.append(ToolCall(item.call_id, name, arguments))
        elif isinstance(item, (w.FunctionCallOutputItem, w.CustomToolCallOutputItem)):
            out.append(Message("tool", _part_text(item.output, f"input[{i}].output", images),
                               tool_call_id=item.call_id,
                               name=flat_name(item.namespace, item.name) if item.name
                               else tool_names.get(item.call_id)))
        elif isinstance(item, w.ReasoningItem):
            text = "".join(p.text for p in (item.content or item.summary))
            turn = _assistant_turn(out)
            turn.reasoning = (turn.reasoning or "") + text
    return attach_images(out, images)


def to_tool_choice(choice: str | w.FunctionChoice | None) -> str:
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        return choice
    if choice.type not in ("function", "custom") or not choice.name:
        raise UnsupportedField("tool_choice.type", f"'{choice.type}' is not supported; use "
                               "'auto', 'none', 'required', a function or a custom tool")
    return choice.name


def to_thinking(reasoning: w.Reasoning | None) -> bool | None:
    if reasoning is None:
        return None
    for name in ("summary", "generate_summary"):
        value = getattr(reasoning, name)
        if value not in (None, "auto", "none"):
            raise UnsupportedField(f"reasoning.{name}", "cannot be honoured: reasoning is "
                                   "returned as raw reasoning_text, not summarised")
    if reasoning.effort is None:
        return None
    return reasoning.effort not in ("none", "minimal")


def to_response_format(text: w.TextConfig | None) -> ResponseFormat | None:
    if text is None:
        return None
    fmt = text.format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object", param="text.format")
    if fmt.schema is None:
        raise InvalidRequest("'text.format.schema' is required for json_schema.",
                             param="text.format.schema")
    return ResponseFormat("json_schema", schema=fmt.schema, strict=bool(fmt.strict),
                          name=fmt.name, param="text.format")


def to_sampling(req: w.ResponsesRequest) -> SamplingParams:
    sampling = SamplingParams()
    if req.temperature is not None:
        if not 0.0 <= req.temperature <= 2.0:
            raise InvalidRequest("'temperature' must be between 0 and 2.", param="temperature")
        sampling.temperature = req.temperature
    if req.top_p is not None:   # its range is every protocol's (core/checks.py rule 3)
        sampling.top_p = req.top_p
    return sampling


def to_gen_request(req: w.ResponsesRequest, history: list[Message],
                   request: Request | None = None, offered: Offered | None = None
                   ) -> tuple[GenRequest, list[Message]]:
    """The GenRequest, and the conversation (without instructions) to store with the answer."""
    if offered is None:
        offered = offer_tools(req.tools, request)
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise InvalidRequest("'max_output_tokens' must be at least 1.", param="max_output_tokens")
    tool_names = {c.id: c.name for m in history for c in m.tool_calls}
    images: list[ImageRef] = []
    conversation = history + input_messages(req.input, tool_names, request, images)
    messages = ([Message("system", req.instructions)] if req.instructions else []) + conversation
    gen = GenRequest(model=req.model or "default", messages=messages, tools=offered.tools,
                     images=images,
                     tool_choice=to_tool_choice(req.tool_choice),
                     parallel_tool_calls=req.parallel_tool_calls is not False,
                     max_tokens=req.max_output_tokens, sampling=to_sampling(req),
                     stream=req.stream, thinking=to_thinking(req.reasoning),
                     reasoning_effort=req.reasoning.effort if req.reasoning else None,
                     response_format=to_response_format(req.text), user=req.user,
                     sampling_sent=frozenset(name for name in ("temperature", "top_p")
                                             if getattr(req, name) is not None),
                     param_names={"max_tokens": "max_output_tokens"})
    return gen, conversation


# -- response ------------------------------------------------------------------
def response_base(req: w.ResponsesRequest, model: str) -> dict[str, Any]:
    """The request fields a Response object echoes."""
    text_format: dict[str, Any] = {"type": "text"}
    if req.text is not None and req.text.format is not None:
        text_format = msgspec.to_builtins(req.text.format)
    tool_choice = req.tool_choice or "auto"
    return {"id": new_id("resp"), "object": "response", "created_at": created_now(),
            "model": model, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "previous_response_id": req.previous_response_id,
            "parallel_tool_calls": req.parallel_tool_calls is not False, "store": req.store,
            "temperature": req.temperature, "top_p": req.top_p, "truncation": "disabled",
            "tool_choice": tool_choice if isinstance(tool_choice, str)
            else msgspec.to_builtins(tool_choice),
            "tools": list(req.tools or []),
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": None},
            "text": {"format": text_format}, "metadata": req.metadata or {}, "user": req.user,
            "background": False}


def output_message(output: list[dict[str, Any]]) -> Message:
    """The response's output as one assistant turn, for the store."""
    message = Message("assistant")
    for item in output:
        if item["type"] == "message":
            message.content += "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            message.reasoning = (message.reasoning or "") + "".join(
                p["text"] for p in item["content"])
        elif item["type"] == "function_call":
            message.tool_calls.append(ToolCall(
                item["call_id"], flat_name(item.get("namespace"), item["name"]),
                item["arguments"]))
        elif item["type"] == "custom_tool_call":
            message.tool_calls.append(ToolCall(item["call_id"], item["name"],
                                               custom_arguments(item["input"])))
    return message


def store_of(request: Request) -> ResponseStore:
    """Rule 6: one store per app (the Frontend's)."""
    return frontend(request).responses


def _keep(req: w.ResponsesRequest, store: ResponseStore, builder: ResponseBuilder,
          conversation: list[Message]) -> None:
    if req.store and builder.status != "failed":
        store.put(StoredResponse(builder.response(),
                                 conversation + [output_message(builder.output)]))


async def _stream(run: Run, builder: ResponseBuilder, keep: Callable[[], None]
                  ) -> AsyncIterator[str]:
    events = builder.start()
    async for event in choice_events(run.events()):
        events += builder.feed(event)
        yield "".join(sse_frame(dumps(e), event=e["type"])
                      for e in events)
        events = []
        if isinstance(event, (Done, ErrorEvent)):
            keep()


async def start_response(request: Request, req: w.ResponsesRequest) -> Answer:
    store = store_of(request)
    history: list[Message] = []
    if req.previous_response_id is not None:
        history = list(store.get(req.previous_response_id, param="previous_response_id").messages)
    offered = offer_tools(req.tools, request)
    gen, conversation = await translated(request, to_gen_request, req, history, request,
                                         offered)
    (run,) = await generate(request, [gen])
    note_unheld(request, offered, gen, run.markup)
    builder = ResponseBuilder(base=response_base(req, run.model), tools=offered)

    def keep() -> None:
        _keep(req, store, builder, conversation)

    async def body_of() -> dict[str, Any]:
        response = await collected(run, builder)
        keep()
        return response

    return Answer([run], req.stream, lambda: _stream(run, builder, keep), body_of)


create_response = generating(OPENAI, w.ResponsesRequest, start_response)


@endpoint(openai_error)
async def get_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    return JSONResponse(store_of(request).get(response_id).response)


@endpoint(openai_error)
async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    store_of(request).delete(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


routes: list[BaseRoute] = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/responses", create_response, methods=["POST"]),   # llama-server's alias
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]
