"""SIGTERM with streams in flight, through the real CLI and real sockets (cli/serve.py rule 4).

While draining, the listener stays open: new generation work gets 503 +
Retry-After in its protocol's envelope and /health says "draining"; a stream
that can finish within `drain_timeout_s` ends normally; streams that cannot
are cut on their protocol's terminal error frame; the process exits 0 and
logs nothing at ERROR.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from daemon_support import DaemonProcess

DRAIN_S = 3.0
LONG = 12000  # tokens: far more than the tiny model decodes in DRAIN_S

REGISTRY = """\
default = "long"

[models.long]
source = "{path}"
"""


class Stream(threading.Thread):
    """One streaming request; keeps every SSE line; `first` is set at the first data."""

    def __init__(self, url: str, path: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        self.lines: list[str] = []
        self.status = 0
        self.first = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.path, json=self.body, timeout=120) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line:
                        self.lines.append(line)
                    if line.startswith("data:"):
                        self.first.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.first.set()

    def data(self) -> list[Any]:
        out = []
        for line in self.lines:
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                out.append(json.loads(line[5:]))
        return out


def chat(max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": "long", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True, **kw}


def messages(max_tokens: int) -> dict[str, Any]:
    return {"model": "long", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}


def completion(n_predict: int) -> dict[str, Any]:
    return {"prompt": "Once upon a time", "n_predict": n_predict, "temperature": 0,
            "stream": True, "ignore_eos": True}


def refused_while_draining(url: str) -> None:
    """Each protocol's 503 envelope, with Retry-After, and a draining /health."""
    r = httpx.post(url + "/v1/chat/completions", json=chat(8, stream=False), timeout=10)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    assert r.json()["error"]["code"] == "shutting_down"
    r = httpx.post(url + "/v1/messages", json=messages(8), timeout=10)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
    r = httpx.post(url + "/completion", json=completion(8), timeout=10)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    assert r.json()["error"]["code"] == 503
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 503 and health.json()["state"] == "draining"


def never_ends(model: Path) -> Path:
    """Zero the (tied) embedding row of the EOS token: its logit is 0 while the argmax of
    a few hundred random logits is positive, so greedy decoding never stops on its own
    (Anthropic's protocol has no ignore_eos)."""
    import mlx.core as mx

    weights = mx.load(str(model / "model.safetensors"))
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    table = weights["model.embed_tokens.weight"]
    weights["model.embed_tokens.weight"] = mx.concatenate(
        [table[:eos], mx.zeros((1, table.shape[1])), table[eos + 1:]])
    mx.save_safetensors(str(model / "model.safetensors"), weights, metadata={"format": "mlx"})
    return model


def test_sigterm_drains_finishes_short_streams_cuts_long_ones_and_exits_0(tmp_path: Path) -> None:
    from conftest import make_tiny_llama

    model = never_ends(make_tiny_llama(tmp_path / "long", seed=0, max_position_embeddings=16384))
    registry = tmp_path / "models.toml"
    registry.write_text(REGISTRY.format(path=model))
    daemon = DaemonProcess(tmp_path, "--models", str(registry), drain_timeout_s=DRAIN_S)
    try:
        url = daemon.ready()["url"]
        long_streams = [Stream(url, "/v1/chat/completions", chat(LONG)),
                        Stream(url, "/v1/messages", messages(LONG)),
                        Stream(url, "/completion", completion(LONG))]
        short = Stream(url, "/v1/chat/completions", chat(24))
        for stream in (*long_streams, short):
            stream.start()
        for stream in (*long_streams, short):
            assert stream.first.wait(60) and stream.error is None, stream.error
        daemon.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused_while_draining(url)  # the listener is still open, new work is refused
        for stream in (*long_streams, short):
            stream.join(60)
            assert not stream.is_alive() and stream.error is None, stream.error
        assert daemon.proc.wait(60) == 0
    finally:
        daemon.close()

    # the short stream finished normally
    assert short.lines[-1] == "data: [DONE]"
    assert short.data()[-1]["choices"][0]["finish_reason"] == "length"
    # OpenAI: the last frame is an error object naming the shutdown
    openai, anthropic, llamacpp = long_streams
    assert openai.data()[-1]["error"]["code"] == "shutting_down"
    # Anthropic: an `error` event (overloaded_error) ends the stream
    assert anthropic.lines[-2:] == [
        "event: error", anthropic.lines[-1]] and anthropic.data()[-1]["type"] == "error"
    assert anthropic.data()[-1]["error"]["type"] == "overloaded_error"
    # llama.cpp: an error object with the status
    assert llamacpp.data()[-1]["error"]["code"] == 503
    # every long stream got real tokens before it was cut
    assert all(len(s.data()) > 3 for s in long_streams)
    log = daemon.log()
    assert "draining" in log and "ending them" in log
    assert daemon.log_lines_at("ERROR") == [], daemon.log_lines_at("ERROR")
