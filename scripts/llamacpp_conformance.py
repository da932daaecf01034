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
127.0.0.1:N. The only adaptation is a stand-in `wget` module (their utils.py
imports it to fetch models; nothing is downloaded here, and a test that tries
fails with that reason). Server options a test sets (n_slots, n_ctx, --jinja,
a test model's name...) have no effect on an external server: the daemon
serves what it serves, so failures tied to llama.cpp's test models (exact
stories260K text, its 512-token context, slot counts) are expected and named.

Without `--url` the script starts `frink-mlx serve --port 0 --fallback` (the
packaged default model, SmolLM2-135M) and stops it at the end. Results are
read from pytest's JUnit XML; each failure is printed with its first line.
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
from collections import defaultdict
from pathlib import Path

TESTS_IN_SDIST = "vendor/llama.cpp/tools/server/tests"
WGET_SHIM = '''"""Stand-in for the `wget` package: the conformance run downloads nothing."""


def download(url, out=None, bar=None):
    raise RuntimeError(f"no downloads in the frink-mlx conformance run: {url}")
'''


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
    return tests


def start_daemon(log: Path) -> tuple[subprocess.Popen[str], str]:
    exe = Path(sys.executable).with_name("frink-mlx")
    proc = subprocess.Popen([str(exe), "serve", "--port", "0", "--fallback"],
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


def run_tests(tests: Path, url: str, only: list[str], junit: Path) -> None:
    port = url.rsplit(":", 1)[1].strip("/")
    env = {**os.environ, "DEBUG_EXTERNAL": "1", "PORT": port}
    targets = [f"unit/{name}" for name in only] or ["unit"]
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-o", "addopts=", f"--junitxml={junit}", *targets],
                   cwd=tests, env=env, check=False)


def report(junit: Path) -> int:
    """Print passed / failed / skipped per file and each failure's first line."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"passed": 0, "failed": 0,
                                                            "skipped": 0})
    failures: list[tuple[str, str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        file = (case.get("classname") or "").split(".")[-1] + ".py"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts[file]["failed"] += 1
            reason = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append((file, case.get("name") or "", reason[0][:160] if reason else ""))
        elif case.find("skipped") is not None:
            counts[file]["skipped"] += 1
        else:
            counts[file]["passed"] += 1
    total = {"passed": 0, "failed": 0, "skipped": 0}
    print(f"\n{'file':32} {'passed':>7} {'failed':>7} {'skipped':>8}")
    for file in sorted(counts):
        c = counts[file]
        print(f"{file:32} {c['passed']:7} {c['failed']:7} {c['skipped']:8}")
        for key in total:
            total[key] += c[key]
    print(f"{'total':32} {total['passed']:7} {total['failed']:7} {total['skipped']:8}")
    print("\nfailures:")
    for file, name, reason in failures:
        print(f"  {file}::{name}: {reason}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sdist", type=Path, help="llama_cpp_python-*.tar.gz or its folder")
    parser.add_argument("--url", help="a running daemon (default: start one)")
    parser.add_argument("--keep", type=Path, help="work folder to keep (default: a temp dir)")
    parser.add_argument("--only", nargs="*", default=[], help="unit test files to run")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="frink-llamacpp-"))
    work.mkdir(parents=True, exist_ok=True)
    sdist = args.sdist or fetch_sdist(work)
    tests = extract_tests(sdist, work)
    proc = None
    url = args.url
    if url is None:
        proc, url = start_daemon(work / "daemon.log")
    try:
        junit = work / "junit.xml"
        run_tests(tests, url, args.only, junit)
        return report(junit)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    sys.exit(main())
