"""Regression tests of issue 23 ("no one in, no crash from a peer"): each case reproduced on the
code before the fix -- a permissive segment attached, forged capacities and pids trusted,
overflowing counts passing the size checks, strided arrays delivered wrong, peer-announced dtype
codes, shapes, headers and counts trusted, 81+-rank names too long, and unbounded p2p
buffers -- now a clear error naming the field (or simply correct). The other user's view is
in test_comm_two_users.py, the framing's corpus in test_fuzz_corpus.py."""
import os
import struct
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest
from comm_helpers import on_both_ranks, run_isolated
from shm_raw import forming_group

from mindspore_hyper import _core
from mindspore_hyper.comm import CommError, CommTimeout, InProcessCommunicator, ShmCommunicator
from mindspore_hyper.comm._common import _C
from mindspore_hyper.comm.p2p import P2PChannel

HERE = os.path.dirname(os.path.abspath(__file__))
FrameError = getattr(_C, "FrameError", _C.CommError)  # (FrameError is new with the fix)


def _name(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:12]


def _formed_pair():
    """A formed 2-rank group (threads) and its raw segment, for forging fields and injecting bytes."""
    name = _name("h")
    thread, done, raw = forming_group(name, timeout=10.0)
    g1 = ShmCommunicator(name, 1, 2, timeout=10.0, channel_bytes=4096)
    thread.join(30)
    return done[0], g1, raw


# ----- segments: who may attach, what is validated -----------------------------------------------
def test_rank_refuses_a_segment_other_users_may_open_and_the_group_loses_nothing():
    name = _name("h")
    thread, done, raw = forming_group(name)
    os.chmod(raw.path, 0o666)  # as a segment pre-created by anyone would be
    with pytest.raises(CommError, match=r"is not this user's private segment .*mode 0666.* refusing to attach"):
        ShmCommunicator(name, 1, 2, timeout=5.0, channel_bytes=4096)
    os.chmod(raw.path, 0o600)
    g1 = ShmCommunicator(name, 1, 2, timeout=5.0, channel_bytes=4096)
    thread.join(30)
    sums = on_both_ranks([done[0], g1], lambda g: g.all_reduce(np.full(3, g.rank + 1, np.float32)))
    for s in sums:
        np.testing.assert_array_equal(s, np.full(3, 3, np.float32))
    for g in (done[0], g1):
        g.close()
    raw.close()


def test_forged_channel_capacity_is_rejected_at_attach_not_divided_by():
    # Before: rank 1 took each channel's capacity from shared memory; 0 divided by zero (SIGFPE).
    out = run_isolated(f"""
        import sys, uuid
        sys.path.insert(0, {HERE!r})
        import numpy as np
        from shm_raw import forming_group
        from mindspore_hyper.comm import CommError, ShmCommunicator
        name = "h" + uuid.uuid4().hex[:12]
        thread, done, raw = forming_group(name)
        raw.set_capacity(0, 1, 0)
        try:
            g1 = ShmCommunicator(name, 1, 2, timeout=5.0, channel_bytes=4096)
        except CommError as exc:
            print("REFUSED", exc)
        else:
            import threading
            thread.join(10)
            threading.Thread(target=lambda: done[0].send(np.ones(4, np.float32), 1)).start()
            print("ATTACHED", g1.recv((4,), np.float32, 0))  # reads through the 0-capacity channel
            sys.exit(0)
        raw.set_capacity(0, 1, 4096)  # repaired: the group still forms
        g1 = ShmCommunicator(name, 1, 2, timeout=5.0, channel_bytes=4096)
        thread.join(10)
        done[0].close(); g1.close(); raw.close()
    """)
    assert "REFUSED" in out and "is corrupt: channel 0 -> 1 has capacity 0 (expected 4096)" in out, out


def test_pids_are_read_once_at_attach_not_on_every_liveness_check():
    # Before: every liveness check read the peer's pid from shared memory: a pid overwritten
    # there (of a process that is gone) made the group fail with "peer died" -- or pointed
    # process_vm_readv at another process.
    g0, g1, raw = _formed_pair()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer exists
    raw.set_pid(0, gone.pid)
    raw.set_pid(1, gone.pid)

    def late_barrier(g):
        if g.rank == 1:
            time.sleep(0.3)  # rank 0 waits long enough for several liveness checks
        g.barrier()
        return "ok"

    assert on_both_ranks([g0, g1], late_barrier) == ["ok", "ok"]
    for g in (g0, g1):
        g.close()
    raw.close()


def test_group_names_of_any_length_get_fixed_length_segment_names():
    # Before: a 128-rank group's name exceeded NAME_MAX (255) and the segment could not be created.
    name = "127_0_0_1_8118_g" + "-".join(map(str, range(128)))
    g = ShmCommunicator(name, 0, 1, timeout=5.0)
    other = ShmCommunicator(name[:-1] + "8", 0, 1, timeout=5.0)  # same readable prefix, other group
    assert len(g.segment_name) <= 1 + 73 and g.segment_name.startswith("/mshyper_127_0_0_1_8118_g0-1-2-3-4-5")
    assert g.segment_name != other.segment_name
    np.testing.assert_array_equal(g.all_reduce(np.arange(3.0)), np.arange(3.0))
    g.close()
    other.close()


# ----- the bindings: overflow, contiguity, dtype ---------------------------------------------------
def test_overflowing_counts_are_rejected_before_any_copy():
    # Before: counts summing past 2^64 wrapped to the size of the (too small) output buffer.
    # rank 0's counts sum to 2^64 + 1 = 1 (mod 2^64), rank 1's are honest: each rank's buffers
    # match its own (wrapped) sums, so the old checks passed and rank 0 wrote past its buffers.
    out = run_isolated("""
        import numpy as np
        from mindspore_hyper.comm import InProcessCommunicator
        g = InProcessCommunicator(2, topology=False, timeout=2.0)
        big = 2**64 - 1
        f = lambda n: np.ones(n, np.float32)
        calls = {
            "all_gather_v": lambda: g._g.all_gather_v([f(1), f(1)], [f(0), f(2)], [[1, big], [1, 1]], ["float32"] * 2),
            "reduce_scatter": lambda: g._g.reduce_scatter([f(0), f(2)], [f(1), f(1)], [[1, big], [1, 1]],
                                                          ["float32"] * 2, ["sum"] * 2),
            "all_to_all_v": lambda: g._g.all_to_all_v([f(0), f(2)], [[1, big], [1, 1]], ["float32"] * 2),
        }
        for what, call in calls.items():
            try:
                call()
                print(what, "NO ERROR")
            except Exception as exc:
                print(what, type(exc).__name__, exc)
    """)
    assert "all_gather_v ValueError InProcCommunicator.all_gather_v: counts[0]: the counts' sum overflows" in out, out
    assert "reduce_scatter ValueError InProcCommunicator.reduce_scatter: counts[0]: the counts' sum overflows" in out
    assert "all_to_all_v ValueError InProcCommunicator.all_to_all_v: send_counts[0]: the counts' sum overflows" in out


@pytest.mark.parametrize("view", ["strided", "reversed", "2-d transposed"])
def test_mailbox_deliver_refuses_views_whose_bytes_are_not_their_elements(view):
    # Before: arange(8)[::2] was delivered as [0, 1, 2, 3]; a reversed view was read past its buffer.
    base = np.arange(8, dtype=np.int64)
    data = {"strided": base[::2], "reversed": base[::-1], "2-d transposed": base.reshape(2, 4).T}[view]
    mid = _core.mailbox_new_id()
    with pytest.raises(ValueError, match="mailbox_deliver: data must be C-contiguous"):
        _core.mailbox_deliver(mid, data)
    _core.mailbox_deliver(mid, np.ascontiguousarray(data))  # the caller's copy is delivered exactly
    np.testing.assert_array_equal(_core.mailbox_take(mid, 5.0).view(np.int64), np.ascontiguousarray(data).ravel())


def test_a_buffer_whose_format_is_not_the_named_dtype_is_refused():
    g = ShmCommunicator(_name("h"), 0, 1, timeout=5.0)
    with pytest.raises(ValueError, match=r"ShmCommunicator.all_reduce: buf: buffer format 'i' does not hold float32"):
        g._g.all_reduce(np.ones(4, np.int32), "float32", "sum", "auto")  # same item size, other type
    with pytest.raises(ValueError, match=r"buffer format '>f' does not hold float32 elements"):
        g._g.all_reduce(np.ones(4, ">f4"), "float32", "sum", "auto")  # byte-swapped: would be summed as garbage
    g.close()


# ----- what a peer sends: headers, counts, p2p descriptors ---------------------------------------
@pytest.mark.parametrize("header, field", [((1 << 40, 3), "field 'count' = 1099511627776 elements of 8 bytes"),
                                           ((10, 99), "field 'dtype' = 99")])
def test_a_forged_send_header_fails_naming_the_peer_without_allocating_its_claim(header, field):
    # Before: a mismatched header was drained by allocating header[0] x dtype size bytes (8 TB here).
    g0, g1, raw = _formed_pair()
    raw.inject(0, 1, struct.pack("<QQ", *header))
    with pytest.raises(FrameError, match=rf"recv.*rank 0 .*{field}"):
        g1.recv((1,), np.float64, 0)
    with pytest.raises(CommTimeout, match="group was aborted"):  # the stream is lost: the group says so
        g0.recv((1,), np.float64, 1)
    for g in (g0, g1):
        g.close()
    raw.close()


def test_forged_all_to_all_counts_fail_naming_the_peer_without_allocating_them():
    # Before: AllToAllPairwise allocated sum(peer counts) x element size (4 TB here) unchecked.
    g0, g1, raw = _formed_pair()
    g1._g.validate = False  # rank 1 only: rank 0 takes no part, its count word is forged
    raw.inject(0, 1, struct.pack("<Q", 1 << 40))
    with pytest.raises(FrameError, match=r"all_to_all \(counts\): rank 0 announced field 'count' = 1099511627776"):
        g1.all_to_all_v(np.ones(2, np.float32), [1, 1])
    for g in (g0, g1):
        g.close()
    raw.close()


@pytest.fixture
def p2p_ends():
    job = _name("p")
    sender = P2PChannel(job, "t", 0, 1, me=0, timeout=10.0)
    receiver = P2PChannel(job, "t", 0, 1, me=1, timeout=10.0)
    deadline = time.time() + 10
    while sender._comm is None and time.time() < deadline:  # its thread attached
        time.sleep(0.001)
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.mark.parametrize("descriptor, field", [
    ([1, 5, 0, 1, -1, 0], r"arrays\[0\].dtype' = -1"),  # before: read as bool
    ([1, 5, 0, 1, 9, 0], r"arrays\[0\].dtype' = 9"),  # before: IndexError
    ([1, 5, 0, 1, 0, 1, 1 << 40], r"arrays\[0\].shape\[0\]' = 1099511627776"),  # before: a 4 TB np.empty
])
def test_a_malformed_p2p_message_is_a_frame_error_naming_peer_and_field(p2p_ends, descriptor, field):
    sender, receiver = p2p_ends
    head = np.zeros(32, np.int64)
    head[0] = len(descriptor)
    head[1:1 + len(descriptor)] = descriptor
    sender._comm.send(head, 1)  # what a broken peer writes instead of P2PChannel._write
    with pytest.raises(FrameError, match=rf"rank 1: .*malformed message from rank 0 on 't': field '{field}"):
        receiver.recv(timeout=5.0)
    with pytest.raises(FrameError):  # the stream cannot be resynchronised: the channel stays failed
        receiver.recv(timeout=5.0)


def test_p2p_limits_hold_at_the_sending_end_too(p2p_ends):
    sender, receiver = p2p_ends
    sender.max_message_bytes = 1024
    with pytest.raises(ValueError, match="arrays: 1028 bytes in all; the channel's max_message_bytes is 1024"):
        sender.send(1, [np.zeros(1024, np.uint8), np.zeros(1, np.int32)])
    with pytest.raises(ValueError, match=r"tag=18446744073709551616: expected"):
        sender.send(2**64)


# ----- bounded buffers and deadlines -----------------------------------------------------------
def test_p2p_sender_queue_is_bounded_by_back_pressure():
    # Before: the queue was unbounded: a sender whose peer does not read held every message.
    job = _name("p")
    sender = P2PChannel(job, "q", 0, 1, me=0, timeout=10.0, channel_bytes=4096, max_queued_bytes=64 << 10)
    receiver = P2PChannel(job, "q", 0, 1, me=1, timeout=10.0, channel_bytes=4096)
    sender.send(0, [np.zeros(48 << 10, np.uint8)])  # larger than the ring: written only as rank 1 reads
    got = []
    reader = threading.Thread(target=lambda: (time.sleep(0.3), got.extend(receiver.recv(t) for t in (0, 1))))
    reader.start()
    start = time.monotonic()
    sender.send(1, [np.ones(48 << 10, np.uint8)])  # 96 KB > 64 KB: waits until message 0 is written
    waited = time.monotonic() - start
    reader.join(30)
    assert waited >= 0.25, waited
    assert [m.arrays[0].sum() for m in got] == [0, 48 << 10]
    sender.close()
    receiver.close()
    # a peer that never reads: the waiting send fails within the timeout, naming the peer
    job = _name("p")
    sender = P2PChannel(job, "q", 0, 1, me=0, timeout=0.3, channel_bytes=4096, max_queued_bytes=64 << 10)
    receiver = P2PChannel(job, "q", 0, 1, me=1, timeout=10.0, channel_bytes=4096)
    sender.send(0, [np.zeros(48 << 10, np.uint8)])
    with pytest.raises(CommTimeout, match="rank 1"):
        sender.send(1, [np.zeros(48 << 10, np.uint8)])
    sender.close()
    receiver.close()


def test_p2p_unmatched_messages_are_bounded_and_kept(p2p_ends):
    sender, receiver = p2p_ends
    receiver.max_unmatched_bytes = 3000
    for i in range(4):
        sender.send(i, [np.full(1000, i, np.uint8)])
    sender.send(9, [np.ones(1, np.uint8)])
    with pytest.raises(CommError, match=r"3 messages of other tags \[\(0,\), \(1,\), \(2,\)\] \(3000 bytes\) wait "
                                        r"unreceived, over max_unmatched_bytes=3000"):
        receiver.recv(9, timeout=5.0)
    assert [receiver.recv(i, timeout=5.0).arrays[0][0] for i in range(4)] == [0, 1, 2, 3]  # nothing lost
    assert receiver.recv(9, timeout=5.0).arrays[0].tolist() == [1]


def test_max_message_bytes_is_enforced_by_sender_and_receiver():
    name = _name("h")
    g0, g1 = on_both_ranks([0, 1], lambda r: ShmCommunicator(name, r, 2, timeout=10.0, max_message_bytes=4096))
    with pytest.raises(CommError, match="send: 4104 bytes to rank 1 exceed max_message_bytes = 4096"):
        g0.send(np.zeros(513, np.float64), 1)
    g0._g.max_message_bytes = 8192  # rank 0 raised it alone: rank 1 rejects the announced size unread
    res = on_both_ranks([g0, g1], lambda g: g.send(np.zeros(513, np.float64), 1) if g.rank == 0
                        else g.recv((513,), np.float64, 0))
    assert isinstance(res[1], FrameError), res
    assert "recv (header): rank 0 announced field 'count' = 513 elements of 8 bytes" in str(res[1])
    for g in (g0, g1):
        g.close()
