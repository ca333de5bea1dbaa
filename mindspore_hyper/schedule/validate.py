"""The rules a runtime relies on, checked on a Schedule in order; the first broken rule raises ScheduleError.

The Schedule value knows nothing of them (this module imports it, never the other way).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Set, Tuple

from mindspore_hyper.schedule.actions import Action, ActionKind, Payload, P2PTensor, P2P_KINDS
from mindspore_hyper.schedule.deadlock import check_deadlock
from mindspore_hyper.schedule.errors import ScheduleError
from mindspore_hyper.schedule.schedule import SEND_SEMANTICS, Schedule, chunk_table

__all__ = ["validate_schedule"]

F, B, BI, BW = (ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT,
                ActionKind.BACKWARD_WEIGHT)


def validate_schedule(schedule: Schedule, sends: str = "buffered") -> None:
    """Check every rule a runtime relies on; raise ScheduleError naming the first broken one.

    Rules: shape and placement (each stage on exactly one rank, each action on its stage's
    rank), one forward and one backward (full, or input + weight) per stage and microbatch, a
    backward after its forward and a weight-gradient after its input-gradient, every input
    received before use, sends and receives pairing up, and no deadlock when the ranks'
    lists run against each other.

    Args:
        schedule: the schedule to check.
        sends: "buffered" (a send hands the tensor to the transport and returns: the contract
            the runtime must keep) or "rendezvous" (a send waits for the matching receive).

    Raises:
        ScheduleError: with `rule` set, naming ranks, list positions and actions.
        ValueError: `sends` is not one of SEND_SEMANTICS.
    """
    if sends not in SEND_SEMANTICS:
        raise ValueError(f"sends={sends!r}: expected one of {SEND_SEMANTICS}")
    _check_shape(schedule)
    _check_placement(schedule)
    _check_counts(schedule)
    _check_order(schedule)
    _check_pairing(schedule)
    check_deadlock(schedule.actions, sends)


def _where(rank: int, index: int, action: Action) -> str:
    return f"rank {rank} #{index} '{action}'"


def _check_shape(s: Schedule) -> None:
    for name in ("num_stages", "num_microbatches", "num_chunks"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ScheduleError("shape", f"{name}={value!r}: expected a positive int")
    if s.num_ranks != s.num_stages:
        raise ScheduleError("shape", f"{s.num_ranks} rank action lists, expected num_stages={s.num_stages}")
    if s.num_virtual_stages != s.num_stages * s.num_chunks:
        raise ScheduleError("shape", f"stage_to_rank places {s.num_virtual_stages} stages, expected "
                                     f"num_stages * num_chunks = {s.num_stages * s.num_chunks}")
    for stage, rank in enumerate(s.stage_to_rank):
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < s.num_ranks:
            raise ScheduleError("placement", f"stage_to_rank[{stage}]={rank!r}: expected a rank in "
                                             f"[0, {s.num_ranks})")
    for rank in range(s.num_ranks):
        held = s.stages_of(rank)
        if len(held) != s.num_chunks:
            raise ScheduleError("placement", f"rank {rank} holds stages {list(held)}, expected "
                                             f"num_chunks={s.num_chunks} stages")
        for index, action in enumerate(s.actions[rank]):
            if not isinstance(action, Action):
                raise ScheduleError("shape", f"rank {rank} #{index}: {action!r} is not an Action")


def _check_placement(s: Schedule) -> None:
    chunks = chunk_table(s.stage_to_rank)
    for rank, actions in enumerate(s.actions):
        for index, a in enumerate(actions):
            where = _where(rank, index, a)
            if a.stage >= s.num_virtual_stages:
                raise ScheduleError("placement", f"{where}: stage {a.stage} does not exist "
                                                 f"({s.num_virtual_stages} virtual stages)")
            owner = s.stage_to_rank[a.stage]
            if owner != rank:
                raise ScheduleError("placement", f"{where}: stage {a.stage} is placed on rank {owner}; each "
                                                 f"stage runs on exactly one rank")
            if a.chunk != chunks[a.stage]:
                raise ScheduleError("placement", f"{where}: chunk {a.chunk}, but stage {a.stage} is chunk "
                                                 f"{chunks[a.stage]} of rank {rank}")
            if a.microbatch >= s.num_microbatches:
                raise ScheduleError("placement", f"{where}: microbatch {a.microbatch} does not exist "
                                                 f"(num_microbatches={s.num_microbatches})")
            if a.kind in P2P_KINDS:
                _check_peer(s, rank, index, a)


def _check_peer(s: Schedule, rank: int, index: int, a: Action) -> None:
    t = a.tensor
    other = t.dst_stage if a.kind is ActionKind.SEND else t.src_stage
    where = _where(rank, index, a)
    if not 0 <= other < s.num_virtual_stages:
        raise ScheduleError("placement", f"{where}: there is no stage {other} to exchange a {t.payload.value} with")
    owner = s.stage_to_rank[other]
    if owner == rank:
        raise ScheduleError("placement", f"{where}: stages {a.stage} and {other} are both on rank {rank}; "
                                         f"the tensor is handed over locally, without send/recv")
    if a.peer != owner:
        raise ScheduleError("placement", f"{where}: peer is rank {a.peer} but stage {other} is on rank {owner}")


def _check_counts(s: Schedule) -> None:
    seen: Dict[Tuple[int, int], Dict[ActionKind, List[str]]] = defaultdict(lambda: defaultdict(list))
    for rank, actions in enumerate(s.actions):
        for index, a in enumerate(actions):
            if a.is_compute:
                seen[(a.stage, a.microbatch)][a.kind].append(f"rank {rank} #{index}")
    for stage in range(s.num_virtual_stages):
        for mb in range(s.num_microbatches):
            found = seen[(stage, mb)]
            if len(found[F]) != 1:
                at = f" ({', '.join(found[F])})" if found[F] else ""
                raise ScheduleError("count", f"stage {stage} mb {mb}: {len(found[F])} forwards{at}, expected "
                                             f"exactly one")
            full, inp, weight = len(found[B]), len(found[BI]), len(found[BW])
            if (full, inp, weight) not in ((1, 0, 0), (0, 1, 1)):
                at = ", ".join(found[B] + found[BI] + found[BW])
                raise ScheduleError("count", f"stage {stage} mb {mb}: {full} full, {inp} input and {weight} "
                                             f"weight backwards{f' ({at})' if at else ''}; expected one full "
                                             f"backward, or one backward_input and one backward_weight")


def _check_order(s: Schedule) -> None:
    last = s.num_virtual_stages - 1
    for rank, actions in enumerate(s.actions):
        done: Set[Tuple] = set()

        def backward_done(stage: int, mb: int) -> bool:
            return (B, stage, mb) in done or (BI, stage, mb) in done

        for index, a in enumerate(actions):
            where = _where(rank, index, a)
            stage, mb = a.stage, a.microbatch
            if a.kind is F and stage > 0:
                _need_input(s, done, where, rank, stage - 1, (F, stage - 1, mb) in done, Payload.ACTIVATION,
                            stage, mb, f"input comes from F s{stage - 1} mb{mb}")
            elif a.kind in (B, BI):
                if (F, stage, mb) not in done:
                    raise ScheduleError("order", f"{where}: a backward only after its forward; F s{stage} mb{mb} "
                                                 f"has not run yet")
                if stage < last:
                    _need_input(s, done, where, rank, stage + 1, backward_done(stage + 1, mb), Payload.GRADIENT,
                                stage, mb, f"output gradient comes from the backward of s{stage + 1} mb{mb}")
            elif a.kind is BW and (BI, stage, mb) not in done:
                raise ScheduleError("order", f"{where}: a weight-gradient only after its input-gradient; "
                                             f"Bi s{stage} mb{mb} has not run yet")
            elif a.kind is ActionKind.SEND:
                produced = (F, stage, mb) in done if a.payload is Payload.ACTIVATION else backward_done(stage, mb)
                if not produced:
                    raise ScheduleError("order", f"{where}: sends a {a.payload.value} its stage has not computed yet")
            if a.kind is ActionKind.RECV:
                done.add(("recv", a.payload, stage, mb))
            else:
                done.add((a.kind, stage, mb))


def _need_input(s: Schedule, done: Set[Tuple], where: str, rank: int, source_stage: int, local_ready: bool,
                payload: Payload, stage: int, mb: int, source: str) -> None:
    """An input is ready: made earlier on this rank, or received earlier from the source stage's rank."""
    if s.stage_to_rank[source_stage] == rank:
        if not local_ready:
            raise ScheduleError("order", f"{where}: its {source} on the same rank, which has not run yet")
    elif ("recv", payload, stage, mb) not in done:
        raise ScheduleError("order", f"{where}: runs before its {payload.value} arrives: no earlier "
                                     f"'recv {payload.value} s{stage} mb{mb}' on rank {rank}")


def _check_pairing(s: Schedule) -> None:
    """Each tensor sent once and received once (after the order rule, a send always has its receive:
    the consumer of the tensor needed it)."""
    sends: Dict[P2PTensor, List[Tuple[int, int, Action]]] = defaultdict(list)
    recvs: Dict[P2PTensor, List[Tuple[int, int, Action]]] = defaultdict(list)
    for rank, actions in enumerate(s.actions):
        for index, a in enumerate(actions):
            if a.kind is ActionKind.SEND:
                sends[a.tensor].append((rank, index, a))
            elif a.kind is ActionKind.RECV:
                recvs[a.tensor].append((rank, index, a))
    for tensor in sorted(set(sends) | set(recvs), key=str):
        for found, what in ((sends[tensor], "sent"), (recvs[tensor], "received")):
            if len(found) > 1:
                at = ", ".join(f"rank {r} #{i}" for r, i, _ in found)
                raise ScheduleError("pairing", f"{tensor} is {what} {len(found)} times ({at}), expected once")
        if not sends[tensor]:
            rank, index, a = recvs[tensor][0]
            raise ScheduleError("pairing", f"{_where(rank, index, a)} has no matching send on rank {a.peer}")
