"""The OpenAI-compatible surface: chat completions, completions, models, responses, and
prompt counting / rendering (counting.py).

Each submodule exports `routes`; this package's `routes` is their
concatenation, which app.py mounts (one list for the server and the tests).
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from . import chat, completions, counting, models, responses  # responses: protocol-adapters helper

routes: list[BaseRoute] = [*chat.routes, *completions.routes, *models.routes, *responses.routes,
                           *counting.routes]
