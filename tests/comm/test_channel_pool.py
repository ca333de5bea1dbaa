"""comm.channel_pool: a job rank's channels are made once per (user, pair), handed out again,
made afresh after a close, and closed per user; other users of the same pair get their own."""
import uuid

import numpy as np
import pytest

from mindspore_hyper.comm.channel_pool import channel_pool


def test_a_pair_is_made_once_per_user_and_made_again_after_close():
    job = "pool" + uuid.uuid4().hex[:10]
    sending, receiving = channel_pool(job, 0), channel_pool(job, 1)
    assert channel_pool(job, 0) is sending and sending is not receiving
    out = sending.channel("a", 0, 1, timeout=10.0)  # returns at once: its thread attaches
    into = receiving.channel("a", 0, 1, timeout=10.0)  # waits for the sending end
    assert sending.channel("a", 0, 1, timeout=10.0) is out and sending.get("a", 0, 1) is out
    assert sending.get("b", 0, 1) is None and sending.channels() == [out] and receiving.channels("a") == [into]
    out.send(3, [np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(into.recv(3).arrays[0], np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"is open with timeout=10, channel_bytes=None; asked for timeout=5"):
        sending.channel("a", 0, 1, timeout=5.0)
    other = sending.channel("b", 0, 1, timeout=10.0)  # another user of the pair: its own channel
    other_into = receiving.channel("b", 0, 1, timeout=10.0)
    assert other is not out
    sending.close("a")
    receiving.close("a")
    assert out.closed and into.closed and not other.closed and sending.channels() == [other]
    again = sending.channel("a", 0, 1, timeout=10.0)  # a fresh channel after the close
    again_into = receiving.channel("a", 0, 1, timeout=10.0)
    assert again is not out
    again.send(1, [np.ones(2, np.int64)])
    np.testing.assert_array_equal(again_into.recv(1).arrays[0], np.ones(2, np.int64))
    for pool in (sending, receiving):
        pool.close()
        assert pool.channels() == []
    assert again.closed and other_into.closed


def test_a_pair_without_this_rank_is_refused():
    with pytest.raises(ValueError, match="me=2 is not one of its two ends"):
        channel_pool("pool" + uuid.uuid4().hex[:10], 2).channel("a", 0, 1, timeout=1.0)
