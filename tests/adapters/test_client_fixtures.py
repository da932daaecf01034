"""Golden requests of real clients (issues 23 and 28), replayed over HTTP: each answered 200
with the frames that client reads.

tests/data/clients/*.json hold one request each -- path, headers, body. The agents'
(Claude Code, Codex, opencode, Qwen Code) are captured from the real CLIs at the
versions in tests/agent_clis/pins.txt by scripts/capture_agents.py, trimmed (long
strings cut, paths and ids scrubbed): each agent's first turn with its own system
prompt and tools, and the turn after a tool call carrying its result; Codex also
under a model name it knows (freeform `apply_patch`, `tool_search`). llama.vim's and
llama.vscode's /infill requests and cache warm-ups are written from their sources.
Only `model` is swapped for a registry entry of the test daemon. The agents' requests
go to the agent CLI tests' daemon (agent_clis/harness.py: a 64k window; its `scripted`
entry calls the agent's own file-reading tool on the file the captured prompt names,
then answers ROUND_TRIP_DONE once the result is back); llama.vim's and llama.vscode's
to the adapter tests' `coder` (fill-in-the-middle).
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from agent_clis.harness import ROUND_TRIP_DONE, AgentDaemon, start_daemon, tool_script, write_png

from frink_mlx.core.images import OMITTED_HEADER
from frink_mlx.http.fields import HEADER

DATA = Path(__file__).resolve().parents[1] / "data" / "clients"
NOTES = "/home/user/project/notes.txt"    # the file the captured prompts ask to read


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    daemon = start_daemon(tmp_path_factory.mktemp("agents"), tool_script)
    yield daemon
    daemon.server.stop()


def fixture(name: str, model: str) -> dict[str, Any]:
    case = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    case["body"]["model"] = model
    return case


def sse_events(server: Any, case: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    events: list[tuple[str, Any]] = []
    with httpx.stream("POST", server.url + case["path"], json=case["body"], headers=case["headers"],
                      timeout=60) as r:
        if r.status_code != 200:
            r.read()
            return r, events
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: ") and line != "data: [DONE]":
                events.append((name, json.loads(line[len("data: "):])))
    return r, events


def responses_done(agents: AgentDaemon, name: str) -> tuple[httpx.Response, dict[str, Any]]:
    r, events = sse_events(agents, fixture(name, "scripted"))
    assert r.status_code == 200, r.text
    names = [event for event, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    return r, events[-1][1]["response"]


def test_codex_turn_and_follow_up(agents: AgentDaemon) -> None:
    r, done = responses_done(agents, "codex_responses_turn")
    assert r.headers.get(HEADER) == "tools[8]"  # only the hosted web_search tool is dropped
    calls = [item for item in done["output"] if item["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("exec_command", {"cmd": f"cat {NOTES}"})]
    assert done["store"] is False and done["parallel_tool_calls"] is True

    r, done = responses_done(agents, "codex_responses_followup")   # exec_command's output
    text = "".join(part["text"] for item in done["output"] if item["type"] == "message"
                   for part in item["content"])
    assert text == ROUND_TRIP_DONE


def test_codex_under_a_model_name_it_knows(agents: AgentDaemon) -> None:
    """The freeform `apply_patch` tool (a Lark grammar), `tool_search`, `text.verbosity`."""
    body = fixture("codex_responses_known_model", "scripted")["body"]
    assert {"custom", "tool_search"} <= {tool["type"] for tool in body["tools"]}
    r, done = responses_done(agents, "codex_responses_known_model")
    assert r.headers.get(HEADER) == "tools[9]"
    assert done["status"] == "completed"


def _claude(agents: AgentDaemon, name: str) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    r, events = sse_events(agents, fixture(name, "scripted"))
    assert r.status_code == 200, r.text
    assert HEADER not in r.headers                  # every field Claude Code sends is declared
    names = [event for event, _ in events if event != "ping"]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    return r, events


def test_claude_code_turn(agents: AgentDaemon) -> None:
    _, events = _claude(agents, "claude_code_messages")
    blocks = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [b["type"] for b in blocks] == ["tool_use"]
    args = "".join(data["delta"]["partial_json"] for name, data in events
                   if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta")
    assert blocks[0]["name"] == "Read" and json.loads(args) == {"file_path": NOTES}
    stop = next(data for name, data in events if name == "message_delta")
    assert stop["delta"]["stop_reason"] == "tool_use"


def test_claude_code_tool_result(agents: AgentDaemon) -> None:
    _, events = _claude(agents, "claude_code_tool_result")
    text = "".join(data["delta"].get("text", "") for name, data in events
                   if name == "content_block_delta")
    assert text == ROUND_TRIP_DONE


@pytest.mark.parametrize("agent", ["opencode", "qwen"])
def test_chat_agents_turn_and_follow_up(agents: AgentDaemon, agent: str) -> None:
    for name, expect in ((f"{agent}_chat_turn", "tool_calls"), (f"{agent}_chat_followup", "stop")):
        r, events = sse_events(agents, fixture(name, "scripted"))
        assert r.status_code == 200, r.text
        assert HEADER not in r.headers, r.headers[HEADER]
        chunks = [data for _, data in events]
        finish = [c["choices"][0]["finish_reason"] for c in chunks
                  if c.get("choices") and c["choices"][0].get("finish_reason")]
        assert finish == [expect] and chunks[-1]["usage"]["prompt_tokens"] > 1000
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        if expect == "stop":
            assert "".join(d.get("content") or "" for d in deltas) == ROUND_TRIP_DONE
        else:
            calls = [call for d in deltas for call in d.get("tool_calls") or []]
            assert calls[0]["function"]["name"] == {"opencode": "read", "qwen": "read_file"}[agent]


def test_llama_vim_infill_and_warm_up(live: Any, adapter_engines: dict) -> None:
    case = fixture("llama_vim_infill", "coder")
    r = httpx.post(live.url + case["path"], json=case["body"], timeout=60)
    assert r.status_code == 200 and HEADER not in r.headers
    out = r.json()
    assert set(out) == set(case["body"]["response_fields"])  # cut to the fields it asked for
    assert out["content"] == "a, b" and out["timings/predicted_n"] >= 1
    assert out["timings/prompt_n"] + out["tokens_cached"] > 0
    _, prompt = adapter_engines["coder"].seen[-1]
    assert "<|file_sep|>util.py\nX = 1\n" in prompt and prompt.endswith("<|fim_middle|>")

    warm = fixture("llama_vim_warmup", "coder")
    r = httpx.post(live.url + warm["path"], json=warm["body"], timeout=60)
    assert r.status_code == 200 and r.json() == {}   # response_fields [""]: nothing asked for
    seq, prompt = adapter_engines["coder"].seen[-1]
    assert seq.max_tokens == 1 and "<|file_sep|>util.py\nX = 1\n" in prompt


def test_llama_vscode_infill_and_warm_up(live: Any) -> None:
    case = fixture("llama_vscode_infill", "coder")
    r = httpx.post(live.url + case["path"], json=case["body"], timeout=60)
    assert r.status_code == 200 and HEADER not in r.headers
    out = r.json()
    assert isinstance(out, list) and len(out) == 3            # n_cmpl: 3
    assert {c["content"] for c in out} == {"a, b"} and all(c["stop"] for c in out)
    assert out[0]["generation_settings"]["top_k"] == 40
    warm = fixture("llama_vscode_warmup", "coder")
    r = httpx.post(live.url + warm["path"], json=warm["body"], timeout=60)
    assert r.status_code == 200
    assert r.json()["content"] == "" and r.json()["tokens_predicted"] == 0


@pytest.mark.parametrize("path", ["/props", "/slots", "/v1/health", "/models"])
def test_llama_server_side_routes(live: Any, path: str) -> None:
    r = httpx.get(live.url + path, timeout=10)
    assert r.status_code == 200
    if path == "/props":
        props = r.json()
        assert props["default_generation_settings"]["n_ctx"] > 0
        assert props["total_slots"] >= 1
    if path == "/slots":   # llamacpp rule 5: the batch's rows, idle ones included
        rows = r.json()
        total = httpx.get(live.url + "/props", timeout=10).json()["total_slots"]
        busy = [row["is_processing"] for row in rows]
        assert len(rows) == total and busy == sorted(busy, reverse=True)   # running rows first


# --- sessions that carry a screenshot, on the text-only default model (issue 30) --------
# (named: a fallback name is served by whichever model is active, registry rule 8)
def _screenshot(tmp_path: Path) -> str:
    return base64.b64encode(write_png(tmp_path / "shot.png", size=64).read_bytes()).decode()


def _session_turns(agents: AgentDaemon, case: dict[str, Any], reply: Callable[
        [list[tuple[str, Any]]], list[dict[str, Any]]], turns: int, omitted: int = 1) -> None:
    """`case`, then `turns - 1` more turns, each the history so far + the answer + a new user
    message (as the agents resend it); every turn 200 with the placeholder header."""
    key = "messages" if "messages" in case["body"] else "input"
    ids = []
    for turn in range(turns):
        r, events = sse_events(agents, case)
        assert r.status_code == 200, (turn, r.text)
        assert r.headers.get(OMITTED_HEADER) == str(omitted), (turn, dict(r.headers))
        ids.append(r.headers["x-request-id"])
        case["body"][key] += reply(events) + [{"role": "user", "content": f"And turn {turn + 2}?"}]
    deadline = time.monotonic() + 10           # the ring records a stream once it has closed
    while len(records := [r for r in agents.ring() if r.id in ids]) < turns and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert [(r.status, r.model) for r in records] == [(200, "agent")] * turns   # the default
    assert all(r.cached_tokens for r in records[1:])     # later turns hit the prefix cache


def test_a_claude_code_session_with_a_screenshot_on_the_default_model(
        agents: AgentDaemon, tmp_path: Path) -> None:
    """Claude Code's Read of a PNG (an image inside the tool_result), then three more
    turns, on the daemon's default model (`agent`: text only, the real engine)."""
    case = fixture("claude_code_tool_result", "agent")
    result = case["body"]["messages"][-1]["content"][0]
    result["content"] = [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                      "data": _screenshot(tmp_path)}}]

    def reply(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        text = "".join(d["delta"].get("text", "") for name, d in events
                       if name == "content_block_delta")
        return [{"role": "assistant", "content": [{"type": "text", "text": text or "ok"}]}]

    _session_turns(agents, case, reply, 4)


def test_a_codex_session_with_an_input_image_on_the_default_model(
        agents: AgentDaemon, tmp_path: Path) -> None:
    """`codex exec -i shot.png` (an input_image beside the prompt) and a tool output holding
    one (`view_image`'s), then three more turns, each resending the whole input (store:
    false) with the last response's output items."""
    case = fixture("codex_responses_followup", "agent")
    image = {"type": "input_image", "image_url": "data:image/png;base64," + _screenshot(tmp_path)}
    case["body"]["input"][3]["content"].append(image)
    output = case["body"]["input"][5]
    output["output"] = [{"type": "input_text", "text": output["output"]}, image]

    def reply(events: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        done = events[-1][1]["response"]
        assert events[-1][0] == "response.completed" and done["status"] == "completed"
        return list(done["output"])

    _session_turns(agents, case, reply, 4, omitted=2)
