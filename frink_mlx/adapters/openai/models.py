"""GET /v1/models and /v1/models/{model}: the registry, with what is loaded.

Each entry is OpenAI's model object plus frink fields: `loaded` (it is the
active generation), `kind` (generative / encoder), `aliases`, and
`context_length` -- the served ceiling when loaded, the models.toml cap (or
null: not known until loaded) otherwise; `embedding_dim` (width of the vectors
/v1/embeddings returns for it: its own, its side-car's, or null when it serves
none) and `max_input_tokens` (longest input it takes; null when not known until
loaded) -- both from `Frontend.model_facts` (serving/embeddings.py), as is
`vision` (it reads image parts: models/vision.py; null when not known until
loaded, e.g. a Hugging Face source);
`parallel` (null on one machine; `{"kind": "tensor" | "pipeline", "ranks": N}` when
the loaded model is split over a distributed group, backend/distributed.py rule 3);
`status` "available" or "unavailable" with the `reason` (its source is missing
here: registry rule 5), checked on each listing, so a fixed source shows at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ...http.errors import endpoint, openai_error
from ...http.frontend import frontend
from ..endpoint import json_response

if TYPE_CHECKING:
    from ...registry import ModelSpec, Registry
    from ...serving.frontend import Frontend
    from ...serving.generation import Generation


def context_length_of(gen: Generation | None) -> int | None:
    if gen is None:
        return None
    if gen.plan is not None:
        return int(gen.plan.context_ceiling)
    return int(getattr(gen.loaded, "context_length", 0)) or None


def availability(registry: Registry, spec: ModelSpec) -> dict[str, Any]:
    """{"status": "available"} or {"status": "unavailable", "reason": why} (registry rule 5)."""
    problem = registry.problem(spec)
    return {"status": "available"} if problem is None else \
        {"status": "unavailable", "reason": problem}


def model_object(front: Frontend, spec: ModelSpec, residency: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    gen = front.resident(spec.name)  # serving/hub.py rule 1
    loaded = gen is not None
    created = int(gen.created_unix) if gen is not None else 0
    facts = front.model_facts(spec.name)
    residency = residency if residency is not None else front.model_states()[spec.name]
    return {"id": spec.name, "object": "model", "created": created, "owned_by": "frink-mlx",
            "residency": residency,
            "loaded": loaded, "kind": spec.kind, "aliases": list(spec.aliases),
            "context_length": context_length_of(gen) if loaded else spec.context_length,
            "description": spec.description, "embedding_dim": facts["embedding_dim"],
            "max_input_tokens": facts["max_input_tokens"], "vision": facts["vision"],
            "parallel": _parallel(gen),
            **availability(front.registry, spec)}


def _parallel(gen: Generation | None) -> dict[str, Any] | None:
    kind = getattr(gen.loaded, "parallel", None) if gen is not None else None
    return {"kind": kind, "ranks": gen.loaded.num_ranks} if gen is not None and kind else None


@endpoint(openai_error)
async def list_models(request: Request) -> Response:
    front = frontend(request)
    states = front.model_states()
    data = [model_object(front, spec, states[spec.name])
            for spec in front.registry.entries.values()]
    return json_response({"object": "list", "data": data})


@endpoint(openai_error)
async def get_model(request: Request) -> Response:
    front = frontend(request)
    spec = front.registry.resolve(request.path_params["model"])
    return json_response(model_object(front, spec))


routes: list[BaseRoute] = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/models", list_models, methods=["GET"]),   # llama-server's alias
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
]
