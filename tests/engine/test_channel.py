"""engine/channel.py: the wire layout of a message, and the lost state (no group needed)."""

from __future__ import annotations

import numpy as np
import pytest

from frink_mlx.engine.channel import (
    FIRST_WORDS,
    HEAD_WORDS,
    Commit,
    Load,
    Ping,
    PlanChannel,
    Step,
    decode,
    encode,
)
from frink_mlx.engine.plan import DecodeRow, PrefillChunk, SchedulerOutput
from frink_mlx.errors import Unavailable


def test_a_step_plan_round_trips_through_int32_words():
    plan = SchedulerOutput(
        decode=[DecodeRow(3, 17, [4, 5, 9], 211), DecodeRow(8, 2, [1], 7)],
        prefill=[PrefillChunk(11, [1, 2, 3, 4, 5], 4, [6, 7], [11, 12])],
        copies=[(6, 13, 2)])
    words = encode(Step(5, plan))
    assert words.dtype == np.int32 and 0 < words[0] <= (len(words) - HEAD_WORDS) * 4 < words[0] + 4
    assert decode(words) == Step(5, plan)
    # summing with followers' zeros changes nothing (the broadcast is an all_sum)
    assert decode(words + np.zeros_like(words)) == Step(5, plan)


def test_a_keyed_message_verifies_only_under_its_key_and_sequence_number():
    """Rule 6: a plan altered, injected or replayed on the link is refused."""
    key = bytes(range(32))
    words = encode(Load(2, "tiny-b"), key, 7)
    assert decode(words, key, 7) == Load(2, "tiny-b")
    for other_key, sequence in ((bytes(32), 7), (key, 8)):   # a guessed key; a replay
        with pytest.raises(RuntimeError, match="failed its MAC"):
            decode(words, other_key, sequence)
    forged = words.copy()
    forged[-1] ^= 1
    with pytest.raises(RuntimeError, match="failed its MAC"):
        decode(forged, key, 7)
    unkeyed = encode(Load(2, "tiny-b"))       # a stray that does not know the key
    with pytest.raises(RuntimeError, match="failed its MAC"):
        decode(unkeyed, key, 0)


def test_every_control_message_round_trips():
    for message in (Load(2, "tiny-b"), Commit(2), Ping()):
        assert decode(encode(message)) == message


def test_long_block_tables_need_the_second_round():
    plan = SchedulerOutput(decode=[DecodeRow(i, 5000, list(range(i, i + 1250)), 1) for i in range(16)])
    words = encode(Step(1, plan))
    assert len(words) > FIRST_WORDS
    assert decode(words) == Step(1, plan)


class _Group:
    rank, size, group = 0, 2, None


def test_a_lost_channel_refuses_every_exchange_and_calls_back_once():
    channel = PlanChannel(_Group(), timeout_s=1, load_timeout_s=1, ping_s=1)
    reasons: list[str] = []
    channel.on_lost.append(reasons.append)
    channel.mark_lost("rank 1 stopped answering")
    channel.mark_lost("again")
    assert reasons == ["rank 1 stopped answering"]
    with pytest.raises(Unavailable, match="rank 1 stopped answering"), channel.exclusive():
        pass
