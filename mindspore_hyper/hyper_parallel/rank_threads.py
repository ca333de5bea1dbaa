"""Per-rank simulation: a script that builds rank-specific pieces (upstream's pipeline scripts
build their stage from their rank) runs once per simulated device, in one process.

`run_per_rank(script, size)` runs the script in `size` threads, thread r as rank r: the API's
`get_rank()`, and MindSpore's `mindspore.communication` queries while `simulated_communication`
is on (`mindspore-hyper run` turns it on in simulation), answer for that rank. The threads take
turns, one running at a time: a rank runs until it waits for a tensor another rank has not sent
yet (a pipeline receive) or ends, then the next rank in round-robin order runs. So every rank's
MindSpore work runs alone, as in its own process, and the run is deterministic. When every
living rank waits and nothing moves, the waiting rank raises (a deadlock, named), and the other
ranks stop. A failing rank stops the run with its error.

A DeviceMesh made in a thread holds the thread's rank (a mesh without it is refused for DTensors,
as under msrun); the thread simulates all the mesh's devices, so each of a mesh's ranks computes
the same values (a pipeline rank of several devices: session.py, pipeline_schedule.py).
"""
from __future__ import annotations

import builtins
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Set

from mindspore import Tensor

from mindspore_hyper.pipeline.stage_transport import Mailbox

__all__ = ["run_per_rank", "thread_rank", "per_rank_transport", "simulated_communication", "PerRankDeadlock"]


class PerRankDeadlock(RuntimeError):
    """Every living rank of a per-rank run waits for a tensor nobody will send."""


class _Aborted(BaseException):
    """Raised in a waiting rank when another rank failed (not an error of its own)."""


class _Turns:
    """Whose turn it is to run (see module docstring)."""

    def __init__(self, size: int):
        self.size = size
        self.cond = threading.Condition()
        self.turn = 0
        self.live: Set[int] = set(range(size))
        self.stalls = 0  # turns passed by waiting ranks since a tensor last moved
        self.failure: Optional[tuple] = None  # (rank, exception) of the first failing rank

    def _next(self, rank: int) -> Optional[int]:
        for step in range(1, self.size + 1):
            if (rank + step) % self.size in self.live:
                return (rank + step) % self.size
        return None

    def _wait_turn(self, rank: int) -> None:
        while self.turn != rank and self.failure is None:
            self.cond.wait()
        if self.failure is not None:
            raise _Aborted()

    def begin(self, rank: int) -> None:
        with self.cond:
            self._wait_turn(rank)

    def wait(self, rank: int, what: str) -> None:
        """Rank `rank` waits for `what`: pass the turn, return at its next turn.

        Raises:
            PerRankDeadlock: every living rank passed its turn with nothing sent in between.
        """
        with self.cond:
            self.stalls += 1
            if self.stalls > 2 * len(self.live):
                raise PerRankDeadlock(f"rank {rank} waits for {what}, and no rank can progress (ranks "
                                      f"{sorted(self.live)} all wait): the ranks' schedules do not match")
            self.turn = self._next(rank)
            self.cond.notify_all()
            self._wait_turn(rank)

    def moved(self) -> None:
        with self.cond:
            self.stalls = 0

    def end(self, rank: int, error: Optional[BaseException] = None) -> None:
        with self.cond:
            self.live.discard(rank)
            self.stalls = 0
            if error is not None and self.failure is None:
                self.failure = (rank, error)
            following = self._next(rank)
            if following is not None:
                self.turn = following
            self.cond.notify_all()


class _TurnTransport:
    """Pipeline transfers between the ranks of a per-rank run: a send puts the tensor in the
    peer's mailbox; a receive passes the turn until its tensor has arrived."""

    def __init__(self, turns: _Turns):
        self.turns = turns
        self.mailboxes = [Mailbox(r) for r in range(turns.size)]

    def send(self, src: int, key, value: Tensor, peer: int) -> None:
        self.mailboxes[peer].put(key, value)
        self.turns.moved()

    def recv(self, key, peer: int):
        me = thread_rank()
        while True:
            value = self.mailboxes[me].poll(key)
            if value is not None:
                return value
            self.turns.wait(me, f"'{key}' from rank {peer}")

    def expect(self, counts) -> None:
        """Nothing to prepare (every rank's mailbox exists)."""

    def flush(self) -> None:
        """Sends are delivered at once."""


_LOCAL = threading.local()
_RUN: List[object] = []  # the active run's transport (one run at a time)


def thread_rank() -> Optional[int]:
    """The rank this thread runs in a per-rank run, else None."""
    return getattr(_LOCAL, "rank", None)


def per_rank_transport() -> _TurnTransport:
    """The transport between the ranks of the active per-rank run.

    Raises:
        RuntimeError: no per-rank run is active in this thread.
    """
    if thread_rank() is None or not _RUN:
        raise RuntimeError("no per-rank run is active in this thread")
    return _RUN[0]


def _communication(size: int, refuse: Callable[[str], None]) -> dict:
    """Stand-ins for mindspore.communication's job queries in a simulated run (see
    `simulated_communication`)."""

    def world(group) -> None:
        if group is not None and not str(group).endswith("world_group"):
            raise ValueError(f"group={group!r}: a simulated job knows the world group only; run under msrun for "
                             f"other groups")

    def rank_query(name: str) -> Callable:
        def query(group=None):
            world(group)
            rank = thread_rank()
            if rank is None:
                refuse(f"mindspore.communication.{name}()")
            return rank

        return query

    def group_size(group=None):
        world(group)
        return size

    def nothing(*args, **kwargs):
        return None

    return {"init": nothing, "release": nothing, "get_rank": rank_query("get_rank"),
            "get_local_rank": rank_query("get_local_rank"), "get_group_size": group_size,
            "get_local_rank_size": group_size}


@contextmanager
def simulated_communication(size: int, refuse: Callable[[str], None]) -> Iterator[None]:
    """While a simulated script runs, MindSpore's `mindspore.communication` speaks for the
    simulated job: `init`/`release` do nothing (the job is this process), `get_group_size` and
    `get_local_rank_size` answer `size`, `get_rank`/`get_local_rank` answer the thread's rank
    in a per-rank run and otherwise call `refuse(name)` (which raises: the rank differs per device).
    """
    import mindspore.communication as package
    import mindspore.communication.management as management

    stand_ins = _communication(size, refuse)
    saved = [(module, name, getattr(module, name)) for module in (package, management) for name in stand_ins
             if hasattr(module, name)]
    for module, name, _ in saved:
        setattr(module, name, stand_ins[name])
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def run_per_rank(script: str, size: int) -> int:
    """Run `script` once per rank 0..size-1 (see module docstring).

    Args:
        script: the script's path (run as `__main__`; `sys.argv` and `sys.path` as the caller set them).
        size: the number of ranks.

    Returns:
        0, or the largest `SystemExit` code a rank exited with.

    Raises:
        the first failing rank's exception (after every rank stopped).
    """
    with open(script) as f:
        code = compile(f.read(), script, "exec")
    turns = _Turns(size)
    _RUN[:] = [_TurnTransport(turns)]
    exits = [0] * size

    def body(rank: int) -> None:
        _LOCAL.rank = rank
        try:
            turns.begin(rank)
            exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": builtins})
            turns.end(rank)
        except _Aborted:
            turns.end(rank)
        except SystemExit as stop:
            exits[rank] = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            turns.end(rank)
        except BaseException as error:  # noqa: B036 -- handed to the caller's thread below
            turns.end(rank, error)

    threads = [threading.Thread(target=body, args=(r,), name=f"rank {r}") for r in range(size)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _RUN.clear()
    if turns.failure is not None:
        rank, error = turns.failure
        error.add_note(f"(raised by rank {rank} of the per-rank simulation)")
        raise error
    return max(exits, key=abs)
