"""backend/trust.py: the group secret file (rule 1) and the proof's arithmetic (rule 2)
over a stand-in group; the real ranks are in tests/serving/test_distributed_trust.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from frink_mlx.backend import trust
from frink_mlx.errors import ConfigError


def test_a_secret_file_must_be_private_regular_and_long_enough(tmp_path: Path) -> None:
    path = tmp_path / "group_secret"
    with pytest.raises(ConfigError, match="no group secret at"):
        trust.read_secret(path)
    assert trust.ensure_secret(path) and not trust.ensure_secret(path)
    assert len(trust.read_secret(path)) == 64
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="mode 0640.*chmod 600"):
        trust.read_secret(path)
    short = tmp_path / "short"
    short.write_text("tiny\n")
    short.chmod(0o600)
    with pytest.raises(ConfigError, match="4 characters; it needs at least 16"):
        trust.read_secret(short)
    with pytest.raises(ConfigError, match="not a regular file"):
        trust.read_secret(tmp_path)


def _prove_all(monkeypatch: pytest.MonkeyPatch, secrets: list[bytes]) -> list[object]:
    """Run `prove` for every rank with an all_gather replaying the others' inputs."""
    import secrets as stdlib_secrets

    size = len(secrets)
    nonces = [stdlib_secrets.token_bytes(trust.NONCE_BYTES) for _ in range(size)]
    transcript = trust._LABEL + size.to_bytes(4, "big") + b"".join(nonces)
    tags = [trust._tag(s, transcript, r) for r, s in enumerate(secrets)]
    results: list[object] = []
    for rank, secret in enumerate(secrets):
        answers = iter([nonces, tags])
        monkeypatch.setattr(trust, "_all_gather",
                            lambda group, data, answers=answers: next(answers))

        class Group:
            def rank(self) -> int:
                return rank  # noqa: B023

            def size(self) -> int:
                return size

        try:
            results.append(trust.prove(Group(), secret, source="f"))
        except ConfigError as exc:
            results.append(str(exc))
    return results


def test_every_rank_agrees_on_one_plan_key_when_the_secrets_match(monkeypatch) -> None:
    keys = _prove_all(monkeypatch, [b"s" * 32] * 3)
    assert all(isinstance(k, bytes) and len(k) == 32 for k in keys) and len(set(keys)) == 1


def test_a_rank_with_another_secret_is_named_by_every_other_rank(monkeypatch) -> None:
    results = _prove_all(monkeypatch, [b"s" * 32, b"s" * 32, b"x" * 32])
    assert results[0] == results[1].replace("rank 1:", "rank 0:") == (
        "rank 0: the group refused to form: rank(s) [2] did not prove the group secret of f "
        "(every rank needs the same secret file)")
    assert "rank(s) [0, 1]" in results[2]
