"""Ollama's model routes: GET /api/tags, POST /api/show, GET /api/ps, GET /api/version,
POST /api/pull -- answered from the registry (models.toml) and the hub.

Rules:
1. Every registry entry is a model, listed as `name:latest` (Ollama's clients
   expect a tag; `name` and `name:latest` both resolve). `size` and
   `modified_at` are the source's on disk (a checkpoint dir sums its files);
   `digest` is a SHA-256 of the entry's name and source -- a stable id, not an
   Ollama blob digest. What cannot be known without loading is null.
2. /api/show answers from the registry, plus what the loaded generation knows
   when that model is the one loaded (its config, chat template, context
   ceiling, whether it thinks). `capabilities`: "completion" and "tools" for
   generative models (tools reach any template: core/prompt.py), "thinking"
   when the loaded tokenizer has think markers, "vision" when it reads images
   (`Frontend.model_facts`, as Ollama marks its vision models), "embedding"
   for encoders.
3. /api/ps lists every resident generation (and retired ones still draining):
   `size` the weights' bytes, `size_vram` the same on Metal's unified memory
   and 0 on the CPU backend, `expires_at` when idle eviction would retire it
   (its keep-alive, serving/residency.py; null when it has none or is pinned),
   `context_length` the context ceiling.
4. /api/pull downloads nothing (frink-mlx serves what models.toml names): a
   registry entry answers `{"status": "success"}` (one NDJSON line when
   streaming); any other name is a 404 naming models.toml.
5. /api/version answers `OLLAMA_API_VERSION`, the Ollama release whose API these
   routes speak, because clients gate on it (Codex's `--oss` mode refuses any
   Ollama older than 0.13.4); frink-mlx's own version is in `frink_version` and
   the `x-frink-version` header.
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ... import __version__
from ...errors import ConfigError, ModelNotFound
from ...http.body import decode_body
from ...http.errors import endpoint, ollama_error
from ...http.frontend import frontend
from ...http.sse import StreamResponse
from ...registry import resolve_source
from ..endpoint import NDJSON_MEDIA_TYPE, json_response, ndjson_line
from ..openai.models import context_length_of
from . import wire
from .translate import model_name

if TYPE_CHECKING:
    from ...registry import ModelSpec
    from ...serving.frontend import Frontend
    from ...serving.generation import Generation


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    try:   # a models.toml keep_alive of 1e308 seconds is no date (requests' are clamped)
        stamp = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None
    return stamp.isoformat().replace("+00:00", "Z")


def _on_disk(spec: ModelSpec) -> tuple[int | None, float | None]:
    """Rule 1: (bytes, mtime) of the entry's source, or (None, None) when absent."""
    try:
        path = resolve_source(spec)
    except ConfigError:
        return None, None
    files = [path] if path.is_file() else [p for p in Path(path).rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), path.stat().st_mtime


def _details(spec: ModelSpec, gen: Generation | None) -> dict[str, Any]:
    config = gen.loaded.config if gen is not None and gen.spec.name == spec.name else {}
    family = str(config.get("model_type", "")) if config else ""
    return {"parent_model": "", "format": "gguf" if spec.source.lower().endswith(".gguf")
            else "mlx", "family": family, "families": [family] if family else None,
            "parameter_size": "", "quantization_level": ""}


def _digest(spec: ModelSpec) -> str:
    return hashlib.sha256(f"{spec.name}\0{spec.source}".encode()).hexdigest()


def tagged(name: str) -> str:
    """Rule 1: `name:latest` unless the name carries a tag already."""
    return name if ":" in name else f"{name}:latest"


def tag_entry(front: Frontend, spec: ModelSpec) -> dict[str, Any]:
    size, mtime = _on_disk(spec)
    return {"name": tagged(spec.name), "model": tagged(spec.name), "modified_at": _iso(mtime),
            "size": size, "digest": _digest(spec), "details": _details(spec, front.hub.current)}


@endpoint(ollama_error)
async def tags(request: Request) -> Response:
    front = frontend(request)
    return json_response({"models": [tag_entry(front, spec)
                                     for spec in front.registry.entries.values()]})


def _capabilities(spec: ModelSpec, gen: Generation | None, vision: bool | None = None) -> list[str]:
    if spec.kind == "encoder":
        return ["embedding"]
    caps = ["completion", "tools"]
    if gen is not None and getattr(gen.loaded.tokenizer, "has_thinking", False):
        caps.append("thinking")
    if vision:
        caps.append("vision")
    return caps


def _model_info(spec: ModelSpec, gen: Generation | None, ceiling: int | None) -> dict[str, Any]:
    if gen is None:
        return {"general.architecture": None, "general.name": spec.name}
    arch = str(gen.loaded.config.get("model_type", ""))
    info: dict[str, Any] = {"general.architecture": arch, "general.name": spec.name}
    if ceiling is not None:
        info[f"{arch}.context_length"] = ceiling
    return info


@endpoint(ollama_error)
async def show(request: Request) -> Response:
    body = await decode_body(request, wire.ModelRequest)
    front = frontend(request)
    spec = front.registry.resolve(model_name(body.model_name))
    gen = front.resident(spec.name)  # serving/hub.py rule 1
    _, mtime = _on_disk(spec)
    ceiling = context_length_of(gen) if gen is not None else spec.context_length
    template = spec.chat_template
    if template is None and gen is not None and gen.loaded.tokenizer is not None:
        template = getattr(gen.loaded.tokenizer, "chat_template", None)
    return json_response({"modelfile": "", "parameters": "", "template": template or "",
                          "license": "", "details": _details(spec, gen),
                          "model_info": _model_info(spec, gen, ceiling),
                          "capabilities": _capabilities(spec, gen,
                                                        front.model_facts(spec.name)["vision"]),
                          "modified_at": _iso(mtime)})


def ps_entry(front: Frontend, gen: Generation) -> dict[str, Any]:
    """Rule 3: one resident generation as /api/ps lists it (sizes, expiry, context)."""
    spec = gen.spec
    residency = front.model_states().get(spec.name) or {}
    keep_alive_s, last_used = residency.get("keep_alive_s"), residency.get("last_used")
    expires_at = None
    if keep_alive_s is not None and keep_alive_s >= 0 and residency.get("generation") == gen.number:
        expires_at = max(last_used or 0.0, gen.created_unix) + keep_alive_s
    size = int(gen.plan.weights_bytes) if gen.plan is not None else None
    on_metal = front.hub.backend.name == "metal"
    return {"name": tagged(spec.name), "model": tagged(spec.name), "size": size,
            "size_vram": size if on_metal else 0, "digest": _digest(spec),
            "details": _details(spec, gen), "context_length": context_length_of(gen),
            "expires_at": _iso(expires_at)}


@endpoint(ollama_error)
async def ps(request: Request) -> Response:
    front = frontend(request)
    gens = list(reversed(front.hub.resident)) + front.hub.retired  # most recently used first
    return json_response({"models": [ps_entry(front, g) for g in gens]})


OLLAMA_API_VERSION = "0.13.5"   # rule 5


@endpoint(ollama_error)
async def version(request: Request) -> Response:
    response = json_response({"version": OLLAMA_API_VERSION, "frink_version": __version__})
    response.headers["x-frink-version"] = __version__
    return response


@endpoint(ollama_error)
async def pull(request: Request) -> Response:
    body = await decode_body(request, wire.ModelRequest)
    name = model_name(body.model_name)
    try:
        frontend(request).registry.resolve(name)
    except ModelNotFound:
        raise ModelNotFound(name) from None
    if not body.stream:
        return json_response({"status": "success"})

    async def frames() -> Any:
        yield ndjson_line({"status": "success"})

    return StreamResponse(frames(), keepalive_frame=None, media_type=NDJSON_MEDIA_TYPE)


routes: list[BaseRoute] = [
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/version", version, methods=["GET"]),
    Route("/api/pull", pull, methods=["POST"]),
]
