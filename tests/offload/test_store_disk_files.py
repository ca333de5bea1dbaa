"""The block store's disk-tier files have no name (O_TMPFILE, or unlinked right after open):
blocks on disk leave nothing visible in the offload directory, read back intact, and a process
killed with SIGKILL while holding them leaves no file behind."""
import os
import signal

import numpy as np

from mindspore_hyper import _core

BS = 64 * 1024


def store_with_blocks_on_disk(directory, count=4):
    """A store whose `count` blocks (block i filled with i + 1) all live on the disk tier."""
    s = _core.BlockStore(BS, BS, BS, str(directory))
    blocks = [s.allocate() for _ in range(count)]
    for i, b in enumerate(blocks):
        s.write(b, np.full(BS, i + 1, np.uint8))
    for b in blocks:
        if s.has_valid_copy(b, "device"):
            s.evict(b, "device")
        if s.has_valid_copy(b, "host"):
            s.evict(b, "host")
    assert all(s.has_valid_copy(b, "disk") and not s.has_valid_copy(b, "host") for b in blocks)
    return s, blocks


def test_blocks_on_disk_leave_no_visible_file_and_read_back(tmp_path):
    s, blocks = store_with_blocks_on_disk(tmp_path)
    assert os.listdir(tmp_path) == []
    path, _ = s.disk_location(blocks[0])
    assert path.startswith("/proc/self/fd/") and os.readlink(path).endswith("(deleted)"), os.readlink(path)
    for i, b in enumerate(blocks):
        assert (s.read(b) == i + 1).all()
    assert s.stats()["bytes_moved"]["disk->host"] >= len(blocks) * BS


def test_a_killed_process_leaves_no_disk_file(tmp_path):
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: blocks on disk, then wait to be killed
        try:
            store_with_blocks_on_disk(tmp_path / "offload", count=6)
            os.write(ready_w, b"1")
            signal.pause()
        finally:
            os._exit(1)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert os.listdir(tmp_path / "offload") == []
