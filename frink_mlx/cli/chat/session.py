"""The conversation a chat session keeps: system prompt, turns, and its saved form.

The history lives here, not in the daemon (the OpenAI protocol is stateless):
every answer re-sends it, so a daemon restarted mid-session picks the
conversation up where it was, and the prefix cache makes that cheap. Rules:
1. A turn enters the history only once answered: a failed request leaves
   nothing behind, and its text is kept as `pending` for /retry.
2. An answer stopped with Ctrl-C keeps what was shown (the user saw it and
   may refer to it); one stopped before any text leaves the turn out, as in 1.
3. /save writes JSON: {"model", "system", "messages"} with the messages in
   OpenAI chat form (system first when set), so a file can be sent as is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .common import Messages


@dataclass(slots=True)
class Conversation:
    system: str | None = None
    turns: Messages = field(default_factory=list)
    pending: str | None = None          # the last user line that got no answer (rule 1)

    def messages(self, user: str | None = None) -> Messages:
        head = [{"role": "system", "content": self.system}] if self.system else []
        tail = [{"role": "user", "content": user}] if user is not None else []
        return head + self.turns + tail

    def answered(self, user: str, answer: str) -> None:
        self.turns += [{"role": "user", "content": user},
                       {"role": "assistant", "content": answer}]
        self.pending = None

    def interrupted(self, user: str, shown: str) -> bool:
        """Rule 2; True when the turn was kept."""
        if not shown:
            self.pending = user
            return False
        self.answered(user, shown)
        return True

    def failed(self, user: str) -> None:
        self.pending = user

    def reset(self) -> None:
        self.turns, self.pending = [], None

    def num_exchanges(self) -> int:
        return len(self.turns) // 2

    def save(self, path: Path, model: str) -> None:
        """Rule 3: the session as JSON (model, system, OpenAI-form messages)."""
        data = {"model": model, "system": self.system, "messages": self.messages()}
        path.expanduser().write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
