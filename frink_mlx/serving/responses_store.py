"""A bounded in-memory store of Responses, for `previous_response_id` and GET /v1/responses/{id}.

Why in memory: the daemon is a local, single-user process; a restart losing the
chain is acceptable and much simpler than a database. Rules:
1. At most `max_entries` responses are kept; storing one more evicts the least
   recently used (a read counts as use), so a long agent session keeps its chain.
2. Each entry keeps the response object as sent and the conversation that
   produced it (earlier turns + this input + this output) as neutral Messages, so a
   follow-up only appends its new input. `instructions` are not part of it: the
   API does not carry them over to follow-ups.
3. A missing id is `NotFound` naming the id and the field it came from.
4. One store per app (`Frontend.responses`, built with it), never module state.
It sits in serving/ because it outlives a request: the OpenAI Responses
adapter (adapters/openai/responses.py) fills and reads it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core.request import Message
from ..errors import NotFound

DEFAULT_MAX_ENTRIES = 512


@dataclass(slots=True)
class StoredResponse:
    response: dict[str, Any]
    messages: list[Message] = field(default_factory=list)


class ResponseStore:
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, entry: StoredResponse) -> None:
        response_id = entry.response["id"]
        self._entries[response_id] = entry
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, response_id: str, *, param: str = "response_id") -> StoredResponse:
        entry = self._entries.get(response_id)
        if entry is None:
            raise NotFound(f"No stored response with id '{response_id}'.", param=param)
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        if self._entries.pop(response_id, None) is None:
            raise NotFound(f"No stored response with id '{response_id}'.", param="response_id")

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries
