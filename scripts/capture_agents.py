"""Re-capture the agents' golden requests (tests/data/clients/*.json) from the real CLIs.

    make agents                       # the CLIs at tests/agent_clis/pins.txt
    .venv/bin/python scripts/capture_agents.py [--out tests/data/clients] [--only claude,codex]

Each CLI runs once, non-interactively, against an in-process daemon (the harness of
tests/agent_clis: the `scripted` entry calls the agent's file-reading tool, so a turn
and its follow-up carrying the tool's result are both captured; Codex also runs once
under a model name it knows, which adds its freeform `apply_patch` tool). The daemon's
recorder keeps each request as it arrived; this script writes one fixture per
request it picks, trimmed so the shape stays and the bulk goes:

1. Every field, list item and tool is kept; a string longer than KEEP_CHARS is cut
   to its start plus a note of how much went (a grammar `definition` is kept whole:
   a cut grammar is no grammar).
2. The run's temporary paths read as /home/user and /home/user/project; session ids,
   device ids and keys are replaced by fixed placeholders, so a re-capture diffs only
   where the client changed.
3. Headers keep what the client sends about itself and the protocol (user agent,
   versions, betas, accept); authorization, host and transport headers go.

Then `pytest tests/adapters/test_client_fixtures.py` replays them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from agent_clis import harness  # noqa: E402

KEEP_CHARS = 160
WHOLE_KEYS = ("definition",)                 # rule 1
DROP_HEADERS = ("authorization", "x-api-key", "host", "content-length", "connection",
                "accept-encoding", "keep-alive", "transfer-encoding")
ID_HEADERS = ("session_id", "session-id", "x-claude-code-session-id", "x-client-request-id",
              "conversation_id", "x-codex-turn-metadata")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX_ID = re.compile(r"\b[0-9a-f]{64}\b")

Pick = Callable[[list[dict[str, Any]]], dict[str, Any] | None]


def has_tools(request: dict[str, Any]) -> bool:
    return bool((request.get("body") or {}).get("tools"))


def carries_tool_result(request: dict[str, Any]) -> bool:
    text = json.dumps(request.get("body") or {})
    return any(marker in text for marker in ('"tool_result"', '"function_call_output"',
                                             '"role": "tool"'))


def first_turn(requests: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in requests if has_tools(r) and not carries_tool_result(r)), None)


def follow_up(requests: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((r for r in requests if carries_tool_result(r)), None)


# (fixture name, agent, model, what it shows, which request)
CAPTURES: list[tuple[str, str, str, str, Pick]] = [
    ("claude_code_messages", "claude", "scripted", "the first Messages turn of `claude -p`",
     first_turn),
    ("claude_code_tool_result", "claude", "scripted",
     "the turn after a Read tool call: its tool_result", follow_up),
    ("codex_responses_turn", "codex", "scripted", "the first Responses turn of `codex exec`",
     first_turn),
    ("codex_responses_followup", "codex", "scripted",
     "the turn after an exec_command call: its function_call_output", follow_up),
    ("codex_responses_known_model", "codex", "gpt-5.5",
     "the first turn under a model name Codex knows (custom apply_patch, tool_search)",
     first_turn),
    ("opencode_chat_turn", "opencode", "scripted", "the first chat turn of `opencode run`",
     first_turn),
    ("opencode_chat_followup", "opencode", "scripted", "the turn after a read tool call",
     follow_up),
    ("qwen_chat_turn", "qwen", "scripted", "the first chat turn of `qwen`", first_turn),
    ("qwen_chat_followup", "qwen", "scripted", "the turn after a read_file tool call",
     follow_up),
]


def trim(value: Any, key: str = "") -> Any:
    """Rule 1."""
    if isinstance(value, dict):
        return {k: trim(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [trim(v, key) for v in value]
    if isinstance(value, str) and len(value) > KEEP_CHARS and key not in WHOLE_KEYS:
        return value[:KEEP_CHARS] + f" [... {len(value) - KEEP_CHARS} chars trimmed]"
    return value


def scrub(text: str, session: harness.Session) -> str:
    """Rule 2, on the JSON text of one fixture."""
    text = text.replace(str(session.work), "/home/user/project")
    text = text.replace(str(session.root / "home"), "/home/user")
    text = text.replace(str(session.root), "/home/user/.agent")
    text = _UUID.sub("00000000-0000-0000-0000-000000000000", text)
    return _HEX_ID.sub("0" * 64, text)


def headers_of(request: dict[str, Any]) -> dict[str, str]:
    """Rule 3."""
    out = {}
    for name, value in sorted(request["headers"].items()):
        if name in DROP_HEADERS:
            continue
        out[name] = "SESSION" if name in ID_HEADERS else value
    return out


def fixture(request: dict[str, Any], agent: str, what: str) -> dict[str, Any]:
    version = harness.pins()[harness.PACKAGES[agent]]
    body = trim(request["body"])
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        body["metadata"] = {k: "USER" if k == "user_id" else v
                            for k, v in body["metadata"].items()}
    return {"client": f"{agent} {version}: {what} (captured by scripts/capture_agents.py)",
            "path": request["path"], "headers": headers_of(request), "body": body}


def run_agent(agent: str, model: str, daemon: harness.AgentDaemon, root: Path
              ) -> tuple[harness.Session, harness.Run]:
    known = model not in ("scripted", "agent")       # a name the agent knows: served by fallback
    session = harness.Session(agent, daemon, root, model="agent" if known else model)
    notes = session.work / "notes.txt"
    notes.write_text("The marker is frink-7731.\n")
    args = harness.PROMPT_ARGS[agent](f"Please frink-read {notes} and report.")
    if agent == "codex":
        args.insert(1, "--dangerously-bypass-approvals-and-sandbox")
        if known:
            args[1:1] = ["-m", model]
    return session, session.run(*args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "clients")
    parser.add_argument("--only", default="", help="comma-separated agents (default: all)")
    args = parser.parse_args(argv)
    wanted = {a for a in args.only.split(",") if a} or set(harness.COMMANDS)
    for agent in sorted(wanted):
        if (why := harness.missing(agent)) is not None:
            print(f"{agent}: {why}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="frink-capture-") as tmp:
        daemon = harness.start_daemon(Path(tmp), harness.tool_script)
        runs: dict[tuple[str, str], tuple[harness.Session, harness.Run]] = {}
        try:
            for name, agent, model, what, pick in CAPTURES:
                if agent not in wanted:
                    continue
                if (agent, model) not in runs:
                    runs[agent, model] = run_agent(agent, model, daemon,
                                                   Path(tmp) / f"{agent}-{len(runs)}")
                session, run = runs[agent, model]
                request = pick(run.requests)
                if request is None:
                    print(f"{name}: no such request in the run\n{run.explain()}", file=sys.stderr)
                    return 1
                text = json.dumps(fixture(request, agent, what), indent=1, ensure_ascii=False)
                path = args.out / f"{name}.json"
                path.write_text(scrub(text, session) + "\n", encoding="utf-8")
                ignored = request.get("response_headers", {}).get("x-frink-ignored-fields")
                print(f"wrote {path} ({request['method']} {request['path']} "
                      f"-> {request.get('status')}, {path.stat().st_size:,} bytes"
                      + (f"; ignored: {ignored}" if ignored else "") + ")")
        finally:
            daemon.server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
