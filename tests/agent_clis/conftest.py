"""One daemon for the agent CLI tests (harness.py), and a fresh session per test."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from agent_clis.harness import AgentDaemon, Session, missing, start_daemon, tool_script


@pytest.fixture(scope="session")
def agent_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentDaemon]:
    daemon = start_daemon(tmp_path_factory.mktemp("agent-daemon"), tool_script)
    yield daemon
    daemon.server.stop()


@pytest.fixture
def new_session(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Session]:
    """new_session(agent, model="agent"): skips (naming why) where the CLI is not installed;
    the daemon starts on the first call, so a run with no CLI never builds it."""
    count = 0

    def make(agent: str, model: str = "agent") -> Session:
        nonlocal count
        reason = missing(agent)
        if reason:
            pytest.skip(reason)
        daemon: Any = request.getfixturevalue("agent_daemon")
        count += 1
        return Session(agent, daemon, tmp_path / f"{agent}-{count}", model=model)

    return make
