"""A small Hugging Face Hub stand-in on a free loopback port, for source tests.

It serves the part of the Hub API huggingface_hub's `snapshot_download` uses:

    GET  /api/models/<org>/<name>/revision/<rev>         repo info: sha (commit), siblings
    GET  /api/models/<org>/<name>/tree/<commit>          the file listing (recursive)
    HEAD /<org>/<name>/resolve/<rev>/<file>              X-Repo-Commit, ETag, Content-Length
    GET  /<org>/<name>/resolve/<rev>/<file>              the bytes

Errors the way the Hub sends them: an unknown repo is 401 with
`X-Error-Code: RepoNotFound` (the Hub does not say whether a private repo
exists), an unknown revision 404 `RevisionNotFound`, and a repo created with
`token=` answers 401 "Invalid credentials in Authorization header" to a
wrong bearer token. Every request is recorded in `requests`.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse


@dataclass
class FakeRepo:
    commits: dict[str, dict[str, bytes]]          # commit sha -> {path: bytes}
    refs: dict[str, str]                          # branch/tag -> commit sha
    token: str | None = None


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    chunk_delay_s: float = 0.0                    # > 0: file bodies trickle (progress tests)

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main",
                 token: str | None = None) -> str:
        """Add (or add a commit to) a repo; returns the new commit sha."""
        digest = hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, FakeRepo({}, {}, token))
        repo.commits[digest] = dict(files)
        repo.refs[branch] = digest
        return digest

    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def checkpoint_files(ckpt: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(ckpt.iterdir()) if p.is_file()}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub

    def log_message(self, *args: Any) -> None:  # quiet test output
        pass

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.fake.requests.append((self.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            self._api(parts[2] + "/" + parts[3], parts[4], "/".join(parts[5:]), body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), body)
        else:
            self._error(404, "EntryNotFound", "no such route", body)

    def _repo(self, repo_id: str, body: bool) -> FakeRepo | None:
        repo = self.fake.repos.get(repo_id)
        sent = self.headers.get("authorization", "")
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found", body)
            return None
        if repo.token is not None and sent != f"Bearer {repo.token}":
            message = "Invalid credentials in Authorization header" if sent else None
            self._error(401, None if message else "RepoNotFound", message, body)
            return None
        return repo

    def _commit(self, repo: FakeRepo, rev: str, body: bool) -> str | None:
        commit = repo.refs.get(rev, rev if rev in repo.commits else None)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
        return commit

    def _api(self, repo_id: str, what: str, rest: str, body: bool) -> None:
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        commit = self._commit(repo, rest.split("/")[0], body)
        if commit is None:
            return
        files = repo.commits[commit]
        if what == "revision":
            data: Any = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                         "siblings": [{"rfilename": name} for name in files]}
        elif what == "tree":
            data = [{"type": "file", "oid": hashlib.sha1(blob).hexdigest(), "size": len(blob),
                     "path": name} for name, blob in files.items()]
        else:
            self._error(404, "EntryNotFound", what, body)
            return
        self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"}, body)

    def _resolve(self, repo_id: str, rev: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id, body)
        if repo is None:
            return
        commit = self._commit(repo, rev, body)
        if commit is None:
            return
        blob = repo.commits[commit].get(filename)
        if blob is None:
            self._error(404, "EntryNotFound", f"{filename} not found", body)
            return
        etag = hashlib.sha256(blob).hexdigest()
        self._send(200, blob, {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                               "Content-Type": "application/octet-stream"}, body,
                   chunk_delay_s=self.fake.chunk_delay_s)

    def _error(self, status: int, code: str | None, message: str | None, body: bool) -> None:
        headers = {"Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        if message:
            headers["X-Error-Message"] = message
        self._send(status, json.dumps({"error": message or code}).encode(), headers, body)

    def _send(self, status: int, payload: bytes, headers: dict[str, str], body: bool,
              chunk_delay_s: float = 0.0) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if not body:
            return
        step = 64 * 1024 if chunk_delay_s else len(payload) or 1
        for at in range(0, len(payload), step):
            self.wfile.write(payload[at:at + step])
            self.wfile.flush()
            if chunk_delay_s:
                time.sleep(chunk_delay_s)
