"""The soak's hostile requests (issue 32), its raw-socket clients and its probes.

Every request the issue sent on main, plus those it found by reading, each with
the status the daemon must answer (400 naming the field, 403 for a WebSocket
upgrade, 200 for what is clamped); a mismatch is counted under its own status
so the report shows it. Bodies are encoded here once: the soak's own JSON
encoding of a million stop strings would hold its event loop for seconds.

The raw clients speak HTTP/1.1 over a socket whose receive buffer is shrunk
before connecting, so the daemon's send buffer fills (tests/http/
test_slow_readers.py does the same): a *stalled* reader reads nothing and must
be cut after `send_timeout_s` (its access line says 499), a *steady* one reads
1 KiB every 20 ms and must get its whole stream.
"""

from __future__ import annotations

import asyncio
import collections
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

MSGS = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@dataclass(frozen=True)
class Hostile:
    name: str
    method: str
    path: str
    body: bytes | None
    want: int
    then: str | None = None   # a GET that must answer 200 right after (keep_alive -> /api/ps)


def _json(name: str, path: str, body: dict[str, Any], want: int = 400,
          then: str | None = None) -> Hostile:
    return Hostile(name, "POST", path, json.dumps({"model": "default", **body}).encode(), want,
                   then)


def _text(name: str, path: str, body: str, want: int = 400) -> Hostile:
    return Hostile(name, "POST", path, body.encode(), want)


def catalogue() -> list[Hostile]:
    deep_tools = ('{"model": "default", "messages": [{"role": "user", "content": "hi"}], '
                  '"tools": [{"type": "function", "function": {"name": "f", "parameters": '
                  '{"a": %s}}}]}' % _nested(100_000))
    deep_grammar = "root ::= " + "(" * 30_000 + '"a"' + ")" * 30_000
    deep_pattern = "(" * 30_000 + "a" + ")" * 30_000
    return [
        _json("anthropic 1,000,000 stop_sequences", "/v1/messages",
              {"max_tokens": 16, "messages": MSGS, "stop_sequences": ["s"] * 1_000_000}),
        _json("openai 65 stop", "/v1/chat/completions", {"messages": MSGS,
                                                         "stop": [f"s{i}" for i in range(65)]}),
        _json("ollama 20,000 options.stop", "/api/chat", {"messages": MSGS, "stream": False,
                                                          "options": {"stop": ["s"] * 20_000}}),
        _json("llama.cpp 257-char stop", "/completion", {"prompt": "hi", "stop": ["x" * 257]}),
        _json("llama.cpp 500,000 logit_bias", "/completion",
              {"prompt": "hi", "logit_bias": [[i, -1] for i in range(500_000)]}),
        _json("logit_bias key \u00b2", "/v1/chat/completions",
              {"messages": MSGS, "logit_bias": {"\u00b2": 1}}),
        _json("logit_bias 4,400-digit key", "/v1/chat/completions",
              {"messages": MSGS, "logit_bias": {"9" * 4400: 1}}),
        _json("completions batch 2,000 prompts", "/v1/completions", {"prompt": ["a"] * 2000}),
        _json("1,000 tools", "/v1/chat/completions", {"messages": MSGS, "tools": [TOOL] * 1000}),
        _text("tools parameters 100,000 deep", "/v1/chat/completions", deep_tools),
        _json("GBNF grammar 30,000 deep", "/completion", {"prompt": "hi",
                                                          "grammar": deep_grammar}),
        _json("schema pattern 30,000 deep", "/v1/chat/completions", {
            "messages": MSGS, "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "schema": {"type": "string", "pattern": deep_pattern}}}}),
        _json("ollama keep_alive 1e308, then /api/ps", "/api/generate",
              {"prompt": "hi", "stream": False, "keep_alive": 1e308, "options": {
                  "num_predict": 4}}, want=200, then="/api/ps"),
        _text("ollama keep_alive nan", "/api/generate",
              '{"model": "default", "prompt": "hi", "stream": false, "keep_alive": NaN}'),
        _json("temperature 1e400", "/v1/chat/completions", {"messages": MSGS,
                                                            "temperature": 1e300 * 10}),
        _json("1.6 MiB prompt", "/v1/chat/completions", {"messages": [
            {"role": "user", "content": "word " * 340_000}]}),
        Hostile("method FOO13 on /metrics", "FOO13", "/metrics", None, 405),
    ]


# --- raw sockets ----------------------------------------------------------------------

def _request(host: str, port: int, head: str, body: bytes, rcvbuf: int | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect
    sock.settimeout(30)
    sock.connect((host, port))
    sock.sendall(head.encode() + body)
    return sock


def _post_head(host: str, path: str, body: bytes, extra: str = "") -> str:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n")


def stalled_reader(host: str, port: int, access_log: Path, max_hold_s: float) -> str:
    """n=8 streams of 1,500 tokens with 20 top logprobs (a few KiB a token, so the
    buffers fill soon), never read: held until the daemon's access log says it ended
    the request, at most `max_hold_s`. The verdict: its status and after how long."""
    request_id = f"soak-stall-{time.monotonic_ns()}"
    body = json.dumps({"model": "default", "messages": MSGS, "stream": True, "n": 8,
                       "max_tokens": 1500, "ignore_eos": True, "temperature": 0.8,
                       "logprobs": True, "top_logprobs": 20}).encode()
    head = _post_head(host, "/v1/chat/completions", body, f"x-request-id: {request_id}\r\n")
    sock = _request(host, port, head, body, 4096)
    started = time.monotonic()
    try:
        while time.monotonic() - started < max_hold_s:
            time.sleep(1.0)
            status = _access_status(access_log, request_id)
            if status is not None:
                minutes = int((time.monotonic() - started) // 60) + 1
                return f"{status} within {minutes} min"
        return f"not ended within {max_hold_s:g}s!"
    finally:
        sock.close()


def _access_status(path: Path, request_id: str) -> str | None:
    text = path.read_text(errors="replace") if path.exists() else ""
    at = text.find(f'"id":"{request_id}"')
    if at < 0:
        return None
    line = text[text.rfind("\n", 0, at) + 1:text.find("\n", at)]
    return str(json.loads(line[line.index("{"):]).get("status"))


def steady_reader(host: str, port: int) -> str:
    """1 KiB every 20 ms of an n=4 stream: slow, never stalled; must end with [DONE]."""
    body = json.dumps({"model": "default", "messages": MSGS, "stream": True, "n": 4,
                       "max_tokens": 200, "ignore_eos": True}).encode()
    sock = _request(host, port, _post_head(host, "/v1/chat/completions", body), body, 4096)
    data = b""
    try:
        while not data.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(1024)
            if not chunk:
                break
            data += chunk
            time.sleep(0.02)
    except OSError as exc:
        return type(exc).__name__
    finally:
        sock.close()
    if not data.startswith(b"HTTP/1.1 200"):
        return data[:12].decode(errors="replace")
    return "200" if b"data: [DONE]" in data else "unterminated"


def websocket_upgrade(host: str, port: int) -> str:
    head = (f"GET /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    with _request(host, port, head, b"", None) as sock:
        return sock.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace").split(" ")[1]


def wrong_host_long_path(host: str, port: int) -> str:
    head = f"GET /{'x' * 16_384} HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n"
    with _request(host, port, head, b"", None) as sock:
        return sock.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace").split(" ")[1]


RAW = {"websocket upgrade": (websocket_upgrade, "403"),
       "wrong Host, 16 KiB path": (wrong_host_long_path, "421")}


async def in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


# --- probes ---------------------------------------------------------------------------

def metric_families(url: str) -> collections.Counter[str]:
    """Series per metric name (labels cut off), to tell bounded growth from a leak."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return collections.Counter(line.split("{")[0].split(" ")[0] for line in text.splitlines()
                               if line and not line.startswith("#"))


def access_statuses(path: Path) -> collections.Counter[str]:
    found: collections.Counter[str] = collections.Counter()
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        try:
            found[str(json.loads(line[line.index("{"):]).get("status"))] += 1
        except ValueError:
            continue
    return found
