"""Ranks 0 and 1's ShmTransports, both in this process, for the transport tests."""
import threading
import uuid
from types import SimpleNamespace

from mindspore_hyper.pipeline.stage_transport import ShmTransport


def transport_pair(prefix: str, timeout_s: float):
    """Yield (rank 0's, rank 1's) ShmTransport over a fresh job name, closing both after (each
    constructor waits for the other rank's sending end, so they are made on two threads)."""
    job = prefix + uuid.uuid4().hex[:10]
    pairs = [(0, 1), (1, 0)]
    worlds = [SimpleNamespace(rank=r, job=job, timeout=timeout_s, transport="shm") for r in (0, 1)]
    made = {}
    t = threading.Thread(target=lambda: made.setdefault(1, ShmTransport(worlds[1], pairs)))
    t.start()
    made[0] = ShmTransport(worlds[0], pairs)
    t.join(30)
    yield made[0], made[1]
    for tr in made.values():
        tr.close()
