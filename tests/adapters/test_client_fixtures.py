"""Golden requests of real clients (issue 23), replayed over HTTP: each answered 200 with
the frames that client reads.

tests/data/clients/*.json hold one request each -- path, headers, body -- written
from the clients' public sources: Codex CLI's Responses turn and follow-up,
Claude Code's Messages turn, llama.vim's and llama.vscode's /infill requests
and cache warm-ups. Only `model` is swapped for a registry entry of the test
daemon (`scripted` for chat, `coder` for fill-in-the-middle); the names the
clients send are served by `fallback` (test_model_fallback.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from frink_mlx.http.fields import HEADER

DATA = Path(__file__).resolve().parents[1] / "data" / "clients"


def fixture(name: str, model: str) -> dict[str, Any]:
    case = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    case["body"]["model"] = model
    return case


def sse_events(live: Any, case: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, Any]]]:
    events: list[tuple[str, Any]] = []
    with httpx.stream("POST", live.url + case["path"], json=case["body"], headers=case["headers"],
                      timeout=60) as r:
        name = ""
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[len("data: "):])))
    return r, events


def test_codex_turn_and_follow_up(live: Any) -> None:
    r, events = sse_events(live, fixture("codex_responses_turn", "scripted"))
    assert r.status_code == 200, r.read()
    assert HEADER not in r.headers        # every field Codex sends is declared
    names = [name for name, _ in events]
    assert names[0] == "response.created" and names[-1] == "response.completed"
    done = events[-1][1]["response"]
    calls = [item for item in done["output"] if item["type"] == "function_call"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert done["store"] is False and done["parallel_tool_calls"] is False

    r, events = sse_events(live, fixture("codex_responses_followup", "scripted"))
    assert r.status_code == 200
    done = events[-1][1]["response"]
    text = "".join(part["text"] for item in done["output"] if item["type"] == "message"
                   for part in item["content"])
    assert text == "The weather in Paris is 18C."


def test_claude_code_turn(live: Any) -> None:
    r, events = sse_events(live, fixture("claude_code_messages", "scripted"))
    assert r.status_code == 200, r.read()
    assert HEADER not in r.headers
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    blocks = [data["content_block"]["type"] for name, data in events
              if name == "content_block_start"]
    assert blocks == ["thinking", "tool_use"]
    args = "".join(data["delta"]["partial_json"] for name, data in events
                   if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta")
    assert json.loads(args) == {"city": "Paris"}
    stop = next(data for name, data in events if name == "message_delta")
    assert stop["delta"]["stop_reason"] == "tool_use"


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
