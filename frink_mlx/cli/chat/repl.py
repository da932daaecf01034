"""The chat loop: read a line, run a command or stream an answer, remember the turn.

Made to feel like `mlx_lm.chat`, with what it lacks. Rules:
1. A line starting with "/" is a command and never reaches the model; so are
   mlx_lm.chat's bare `q`, `r` and `h`. An unknown command is refused with a
   hint. `//text` sends "/text".
2. Ctrl-C while an answer streams stops that answer (ChatModel, common.py
   rule 1) and keeps the history (session.py rule 2). Ctrl-C at the prompt
   warns once; a second one in a row, or Ctrl-D, ends the session (exit 0).
3. A failure is one bracketed line and the loop goes on with the history as
   it was: the daemon going away (mid-answer or between turns), an error
   envelope, a model that cannot load. The next line reconnects by itself --
   every request is a fresh one carrying the whole history -- and /retry
   resends the line that got no answer.
4. Speed: `--verbose` or `/stats` prints one line after each answer
   (common.Stats.line); `/stats` also shows the last answer's at once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import FrinkError
from .common import DAEMON_LOST, DAEMON_UNREACHABLE, ChatModel, ChatParams, Stats
from .prompt import read_line
from .session import Conversation

PROMPT = ">> "

HELP = """\
Commands (a line starting with / is never sent to the model; //text sends /text):
  /help, h          this help
  /reset, r         forget the conversation (the system prompt stays)
  /system [TEXT]    set the system prompt (/system off clears it; alone: show it)
  /model [NAME]     switch to another registry model (alone: show the current one)
  /save FILE        write the conversation as JSON (OpenAI messages)
  /retry            send the last line that got no answer again
  /stats            show tokens/s after every answer (toggle; --verbose starts it on)
  /quit, /exit, q   end the session (also Ctrl-D, or Ctrl-C twice at the prompt)
Ctrl-C while an answer streams stops it; the conversation is kept."""


def say(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def note(line: str) -> None:
    say(line + "\n")


def exchanges(n: int) -> str:
    return f"{n} exchange" + ("" if n == 1 else "s")


@dataclass
class Repl:
    target: ChatModel
    params: ChatParams
    conversation: Conversation
    verbose: bool = False
    last: Stats | None = None
    read: Callable[[str], str] = read_line
    commands: dict[str, Callable[[str], bool]] = field(init=False)

    def __post_init__(self) -> None:
        self.commands = {
            "help": self.cmd_help, "reset": self.cmd_reset, "system": self.cmd_system,
            "model": self.cmd_model, "save": self.cmd_save, "retry": self.cmd_retry,
            "stats": self.cmd_stats, "verbose": self.cmd_stats,
            "quit": self.cmd_quit, "exit": self.cmd_quit,
        }

    # --- the loop -------------------------------------------------------------
    def run(self) -> int:
        note("Type /help for commands. Ctrl-C stops an answer; Ctrl-D or /quit ends.")
        warned = False
        while True:
            try:
                line = self.read(PROMPT)
            except EOFError:
                say("\n")
                return 0
            except KeyboardInterrupt:  # rule 2
                if warned or not self._warn():
                    say("\n")
                    return 0
                warned = True
                continue
            warned = False
            try:
                if not self.handle(line):
                    return 0
            except KeyboardInterrupt:  # a command cut short (a model loading in process)
                note("\n[interrupted]")

    def _warn(self) -> bool:
        """The first Ctrl-C at the prompt; False when a second one cut the warning short."""
        try:
            note("\n[Ctrl-C again (or Ctrl-D) to quit]")
        except KeyboardInterrupt:
            return False
        return True

    def handle(self, line: str) -> bool:
        """One line: False ends the session."""
        text = line.strip()
        if not text:
            return True
        bare = {"q": "quit", "r": "reset", "h": "help"}.get(text)
        if bare is not None:
            return self.commands[bare]("")
        if text.startswith("/") and not text.startswith("//"):
            name, _, arg = text[1:].partition(" ")
            command = self.commands.get(name.lower())
            if command is None:
                note(f"[unknown command /{name}; /help lists them]")
                return True
            return command(arg.strip())
        self.send(line[1:] if text.startswith("//") else line)
        return True

    def send(self, user: str) -> None:
        """Stream one answer (rules 2, 3)."""
        shown: list[str] = []

        def emit(text: str) -> None:
            shown.append(text)
            say(text)

        try:
            stats = self.target.answer(self.conversation.messages(user), self.params, emit)
        except KeyboardInterrupt:
            kept = self.conversation.interrupted(user, "".join(shown))
            note("\n[stopped; " + ("the partial answer is kept]" if kept else
                                   "nothing was answered, /retry sends it again]"))
            return
        except FrinkError as exc:
            self.conversation.failed(user)
            note(("\n" if shown else "") + self.failure(exc))
            return
        say("\n")
        self.conversation.answered(user, "".join(shown))
        self.last = stats
        if self.verbose:
            note(stats.line())

    def failure(self, exc: FrinkError) -> str:
        kept = f"conversation kept ({exchanges(self.conversation.num_exchanges())})"
        if exc.code == DAEMON_LOST:
            return f"[{exc.message}; the unfinished answer was dropped, {kept}; /retry once it is back]"
        if exc.code == DAEMON_UNREACHABLE:
            return f"[{exc.message}; {kept}; /retry once it is back]"
        status = getattr(exc, "status", None)
        where = f" (HTTP {status})" if status else ""
        return f"[error{where}: {exc.message.rstrip('.')}; {kept}]"

    # --- commands: each returns False to end the session --------------------------
    def cmd_help(self, _: str) -> bool:
        note(HELP)
        return True

    def cmd_reset(self, _: str) -> bool:
        self.conversation.reset()
        note("[history cleared]")
        return True

    def cmd_system(self, arg: str) -> bool:
        if not arg:
            note(f"[system prompt: {self.conversation.system!r}]" if self.conversation.system
                 else "[no system prompt; /system TEXT sets one]")
        elif arg.lower() == "off":
            self.conversation.system = None
            note("[system prompt cleared]")
        else:
            self.conversation.system = arg
            note("[system prompt set; the conversation is kept]")
        return True

    def cmd_model(self, arg: str) -> bool:
        if not arg:
            note(f"[model: {self.target.model}, {self.target.label}]")
            return True
        try:
            name = self.target.switch_model(arg)
        except FrinkError as exc:
            note(f"[cannot switch to {arg}: {exc.message.rstrip('.')}; still on {self.target.model}]")
            return True
        self.params.model = arg
        note(f"[now talking to {name}; the conversation is kept]")
        return True

    def cmd_save(self, arg: str) -> bool:
        if not arg:
            note("[usage: /save FILE]")
            return True
        try:
            self.conversation.save(Path(arg), self.target.model)
        except OSError as exc:
            note(f"[cannot save to {arg}: {exc.strerror or exc}]")
            return True
        note(f"[saved {exchanges(self.conversation.num_exchanges())} to {arg}]")
        return True

    def cmd_retry(self, _: str) -> bool:
        if self.conversation.pending is None:
            note("[nothing to retry]")
            return True
        self.send(self.conversation.pending)
        return True

    def cmd_stats(self, _: str) -> bool:
        self.verbose = not self.verbose
        note(f"[speed after each answer: {'on' if self.verbose else 'off'}]")
        if self.verbose and self.last is not None:
            note(self.last.line())
        return True

    def cmd_quit(self, _: str) -> bool:
        return False
