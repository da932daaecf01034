"""The real agent CLIs (issue 28), unmodified, against the daemon: Claude Code (`claude -p`),
Codex (`codex exec`), opencode (`opencode run`) and Qwen Code (`qwen`), at the versions
in pins.txt. Each test skips, naming why, where `make agents` has not installed its CLI.

`agent` is the real engine on a 64k-window tiny checkpoint (agent_model.py: its answer is
ANSWER); `scripted` answers by harness.tool_script, so a tool call goes out and its result
comes back. Statuses and token counts are the daemon's own recent-requests records.
"""

from __future__ import annotations

from typing import Callable

import pytest

from agent_clis.agent_model import ANSWER
from agent_clis.harness import PROMPT_ARGS, ROUND_TRIP_DONE, Session, write_png
from frink_mlx.core.images import IMAGE_PLACEHOLDER

pytestmark = pytest.mark.agents

AGENTS = ["claude", "codex", "opencode", "qwen"]
MARKER = "frink-7731"
NewSession = Callable[..., Session]


def _read_args(agent: str, path: str) -> list[str]:
    args = PROMPT_ARGS[agent](f"Please frink-read {path} and report.")
    if agent == "codex":     # the read runs as a shell command; no sandbox to set up here
        args.insert(1, "--dangerously-bypass-approvals-and-sandbox")
    return args


@pytest.mark.parametrize("agent", AGENTS)
def test_first_turn_answers(agent: str, new_session: NewSession) -> None:
    """Each agent's first turn, with its full system prompt and tools, answered 200."""
    run = new_session(agent).run(*PROMPT_ARGS[agent]("Say hello."))
    assert run.answered(ANSWER), run.explain()
    assert max(r.prompt_tokens or 0 for r in run.model_records()) > 1000   # the real prompt


@pytest.mark.parametrize("agent", AGENTS)
def test_tool_call_round_trip(agent: str, new_session: NewSession) -> None:
    """The model calls the agent's file-reading tool; the agent runs it and sends the
    result back; the answer after it is printed."""
    session = new_session(agent, model="scripted")
    notes = session.work / "notes.txt"
    notes.write_text(f"The marker is {MARKER}.\n")
    run = session.run(*_read_args(agent, str(notes)))
    assert run.answered(ROUND_TRIP_DONE), run.explain()
    assert any("<tool_response>" in p and MARKER in p for p in run.prompts), run.explain()


def test_claude_reads_a_png_and_the_session_goes_on(new_session: NewSession) -> None:
    """Claude Code's Read of a PNG puts an image block in a tool result: it becomes a
    placeholder (x-frink-images-omitted), and the next turn of the session still answers."""
    session = new_session("claude", model="scripted")
    png = write_png(session.work / "shot.png")
    run = session.run(*_read_args("claude", str(png)))
    assert run.answered(ROUND_TRIP_DONE), run.explain()
    omitted = [r for r in run.model_requests()
               if r.get("response_headers", {}).get("x-frink-images-omitted")]
    assert omitted and any(IMAGE_PLACEHOLDER in p for p in run.prompts), run.explain()
    later = session.run("-p", "--continue", "Anything else?")
    assert later.answered("Hello from the script."), later.explain()
    assert any(IMAGE_PLACEHOLDER in p for p in later.prompts)    # the image is in its history


def test_codex_image_then_resume(new_session: NewSession) -> None:
    """`codex exec -i img.png`, then `codex exec resume --last`, which replays the image."""
    session = new_session("codex")
    png = write_png(session.work / "img.png")
    first = session.run("exec", "--skip-git-repo-check", "What is in this image?", "-i", str(png))
    assert first.answered(ANSWER), first.explain()
    again = session.run("exec", "--skip-git-repo-check", "resume", "--last", "And now?")
    assert again.answered(ANSWER), again.explain()
    for run in (first, again):
        request = run.model_requests()[-1]
        assert "input_image" in str(request["body"]["input"])
        assert request["response_headers"].get("x-frink-images-omitted") == "1"


def test_codex_oss_passes_the_ollama_version_check(new_session: NewSession) -> None:
    """`codex exec --oss` checks GET /api/version (>= 0.13.4) and /api/tags first."""
    session = new_session("codex")
    run = session.run("exec", "--oss", "--local-provider", "ollama", "-m", "agent",
                      "--skip-git-repo-check", "Say hello.",
                      extra_env={"CODEX_OSS_BASE_URL": session.daemon.url + "/v1"})
    assert run.answered(ANSWER), run.explain()
    assert ("GET", "/api/version", 200) in [(r.method, r.route, r.status) for r in run.records]


def test_claude_second_session_reads_the_system_prompt_from_the_cache(
        new_session: NewSession) -> None:
    """Two `claude -p` sessions with different prompts, one user in one project: the second
    one's first request finds at least half its prompt in the prefix cache (the billing
    header is dropped). The project's memory path is in the system prompt, so sessions of
    different projects share only its first ~3k characters."""
    session = new_session("claude")
    first = session.run("-p", "Say hello.")
    assert first.answered(ANSWER), first.explain()
    second = session.run("-p", "Name three colours.")
    assert second.answered(ANSWER), second.explain()
    request = next(r for r in second.model_records() if r.route == "/v1/messages")
    assert request.prompt_tokens and request.cached_tokens is not None
    assert request.cached_tokens >= 0.5 * request.prompt_tokens, request
