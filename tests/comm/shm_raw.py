"""Raw access to a forming shared-memory group's segment, for the tests that play a corrupt or
hostile peer: forged header fields, bytes written straight into a channel's ring.

The layout is that of ccsrc/comm/shm_segment.h (also the layout before issue 23, so the same
tests show what the older code did): a 3648-byte header (magic, geometry, attach count, abort
flag, 256 pids, 256 probe addresses), then size x size channels of a 192-byte ChannelHeader
(head at 0, tail at 64, capacity at 128) and `capacity` data bytes; channel `src * size + dst`
carries src -> dst.
"""
import mmap
import os
import struct
import threading
import time

from mindspore_hyper.comm import ShmCommunicator
from mindspore_hyper.comm.shm import SEGMENT_PREFIX

HEADER_BYTES = 3648
CHANNEL_HEADER_BYTES = 192
READY_OFFSET = 32
PIDS_OFFSET = 8 + 4 + 4 + 8 + 8 + 4 * 4 + 512


class RawSegment:
    """The segment of group `name` (size ranks, channels of `capacity` bytes), mapped by this
    process while rank 0 waits for the others (the mapping stays valid after the name is unlinked)."""

    def __init__(self, name: str, size: int, capacity: int, timeout: float = 20.0, creator_failed=lambda: None):
        self.size, self.capacity = size, capacity
        total = HEADER_BYTES + size * size * (CHANNEL_HEADER_BYTES + capacity)
        deadline = time.time() + timeout
        while True:
            found = []
            for f in os.listdir("/dev/shm"):
                try:
                    published = not f.endswith(".init")  # not rank 0's creation temporary
                    if (f.startswith(SEGMENT_PREFIX + name[:32]) and published
                            and os.stat("/dev/shm/" + f).st_uid == os.geteuid()):
                        found.append(f)
                except FileNotFoundError:
                    pass
            if found:
                self.path = "/dev/shm/" + found[0]
                try:
                    if os.stat(self.path).st_size == total:
                        fd = os.open(self.path, os.O_RDWR)
                        self.mem = mmap.mmap(fd, total)
                        os.close(fd)
                        if self.read("i", READY_OFFSET) == 1:
                            return
                        self.mem.close()
                except FileNotFoundError:
                    pass
            error = creator_failed()
            if error is not None:
                raise error
            if time.time() > deadline:
                raise TimeoutError(f"no initialised segment of group {name!r} within {timeout} s")
            time.sleep(0.002)

    def read(self, fmt: str, offset: int):
        return struct.unpack_from("<" + fmt, self.mem, offset)[0]

    def write(self, fmt: str, offset: int, value) -> None:
        struct.pack_into("<" + fmt, self.mem, offset, value)

    def channel(self, src: int, dst: int) -> int:
        """Byte offset of channel src -> dst's header."""
        return HEADER_BYTES + (src * self.size + dst) * (CHANNEL_HEADER_BYTES + self.capacity)

    def set_capacity(self, src: int, dst: int, value: int) -> None:
        self.write("Q", self.channel(src, dst) + 128, value)

    def set_pid(self, rank: int, pid: int) -> None:
        self.write("i", PIDS_OFFSET + 4 * rank, pid)

    def inject(self, src: int, dst: int, data: bytes) -> None:
        """Append `data` (a multiple of 8 bytes, no wrap) to channel src -> dst as if src wrote it."""
        ch = self.channel(src, dst)
        head = self.read("Q", ch)
        start = ch + CHANNEL_HEADER_BYTES + head % self.capacity
        self.mem[start:start + len(data)] = data
        self.write("Q", ch, head + len(data))

    def close(self) -> None:
        self.mem.close()


def forming_group(name: str, capacity: int = 4096, timeout: float = 20.0, **kwargs):
    """Rank 0 of a new 2-rank group constructed on a thread (it waits for rank 1), and the raw
    segment; `done[0]` holds rank 0's communicator (or its exception) once the thread ends."""
    done = [None]

    def rank0():
        try:
            done[0] = ShmCommunicator(name, 0, 2, timeout=timeout, channel_bytes=capacity, **kwargs)
        except Exception as exc:  # returned to the test, which checks it
            done[0] = exc

    thread = threading.Thread(target=rank0)
    thread.start()
    failed = lambda: done[0] if isinstance(done[0], Exception) else None  # noqa: E731
    return thread, done, RawSegment(name, 2, capacity, creator_failed=failed)
