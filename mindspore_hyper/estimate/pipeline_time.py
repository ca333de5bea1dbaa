"""The pipeline part of a step: the schedule simulator's makespan for per-virtual-stage costs.

`pipeline_makespan` builds the strategy's schedule (`mindspore_hyper.schedule.build_schedule`)
and simulates it with each virtual stage's forward / input-gradient / weight-gradient seconds
and the stage-to-stage transfer time. A long step is simulated on fewer micro-batches and
extended by its steady state: makespan(m) = makespan(m_sim) + (m - m_sim) x the slope. For
gpipe, 1f1b, interleaved_1f1b and zb_h1, m_sim = p and the slope is the busiest rank's work per
micro-batch; for the V-shaped zb_v and dualpipe_v, m_sim = 2p and the slope is measured by a
second simulation p micro-batches longer (their steady phase repeats every p micro-batches and,
with uneven stages, idles a little). The tests check this against simulating all m. Beyond
SIMULATION_LIMIT ranks x micro-batches (p = 64 takes seconds in the event loop) the published
bubble formula of `schedule.formulas` for the busiest rank is used instead, and the result says so.

Ranks that share cores (`speeds`, from a `cpu` profile's `core_sharing`): the costs are the
seconds with every rank computing, as the kernels were measured, and `schedule.simulate_shared`
lets the ranks that compute while others wait run `speeds[k - 1]` times as fast (k ranks
computing; or `speeds(rank, computing ranks)` where ranks are bound to cores). The makespan is then that simulation's, of all m micro-batches (with uneven stages
the shared speeds leave no exactly periodic steady state to extend), and `sharing` is its
difference to the makespan at speed 1 (negative where the kernels were timed with every rank
computing: the warm-up, the cool-down and the waits let the others run faster); beyond
SIMULATION_LIMIT, the formula's makespan divided by the speed with every rank computing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence, Tuple

__all__ = ["PipelineTime", "pipeline_makespan", "rank_stages", "SIMULATION_LIMIT"]

SIMULATION_LIMIT = 1600  # ranks x simulated micro-batches


@dataclass(frozen=True)
class PipelineTime:
    """Seconds of the pipelined part of a step.

    Attributes:
        makespan: first forward to last backward, all ranks.
        work: the busiest rank's compute (m x its forward + backward + weight gradient).
        bubble: the makespan at speed 1 - work (idle and transfer time of the busiest rank).
        source: "simulator" (m_sim micro-batches simulated), or "formula" (published bubble).
        simulated_microbatches: m_sim (0 with the formula).
        sharing: makespan - the makespan at speed 1, from ranks sharing cores (0 without
            `speeds`); makespan = work + bubble + sharing.
    """

    makespan: float
    work: float
    bubble: float
    source: str
    simulated_microbatches: int
    sharing: float = 0.0

    @property
    def bubble_fraction(self) -> float:
        return self.bubble / self.makespan if self.makespan else 0.0


def rank_stages(schedule_kind: str, stages: int, chunks: int) -> Tuple[Tuple[int, ...], ...]:
    """The virtual stages each rank runs: r (one chunk), r, r + p, ... (interleaved), r and
    2p - 1 - r (the V-shaped zb_v and dualpipe_v); the builders' `Schedule.stages_of`."""
    if schedule_kind in ("zb_v", "dualpipe_v"):
        return tuple((r, 2 * stages - 1 - r) for r in range(stages))
    return tuple(tuple(r + c * stages for c in range(chunks)) for r in range(stages))


@lru_cache(maxsize=256)
def _simulated(schedule_kind: str, stages: int, microbatches: int, chunks: int, forward: Tuple[float, ...],
               backward_input: Tuple[float, ...], backward_weight: Tuple[float, ...], p2p: float,
               speeds=None) -> float:
    from mindspore_hyper.schedule import build_schedule, simulate_schedule, simulate_shared

    schedule = build_schedule(schedule_kind, stages, microbatches, chunks)
    costs = {"forward": list(forward), "backward_input": list(backward_input), "backward_weight": list(backward_weight),
             "p2p": p2p}
    timeline = simulate_schedule(schedule, **costs) if speeds is None else \
        simulate_shared(schedule, speeds=speeds, **costs)
    return timeline.end


def pipeline_makespan(schedule_kind: str, stages: int, microbatches: int, chunks: int, forward: Sequence[float],
                      backward_input: Sequence[float], backward_weight: Sequence[float], p2p: float,
                      simulation_limit: int = SIMULATION_LIMIT,
                      speeds=None) -> PipelineTime:
    """Makespan of `microbatches` through `stages` ranks with `chunks` virtual stages each.

    Args:
        schedule_kind: a `mindspore_hyper.schedule` kind.
        stages, microbatches, chunks: p, m, v.
        forward, backward_input, backward_weight: seconds per micro-batch per virtual stage
            (p x v entries; a non-split backward is backward_input + backward_weight).
        p2p: seconds of one stage-to-stage activation (or gradient) transfer.
        simulation_limit: ranks x micro-batches simulated at most before the formula is used.
        speeds: ranks sharing cores: speeds[k - 1] = how many times faster a rank computes
            while k ranks compute than the costs say (one entry per k = 1 .. stages), or a
            hashable function (rank, the set of computing ranks) -> that factor (ranks bound to
            cores: `core_sharing.StageSpeeds`); None: every rank computes on its own device.

    Returns:
        The PipelineTime.

    Raises:
        ValueError: a schedule the builders refuse (too few micro-batches, ...), or `speeds`
            of the wrong length.
    """
    f, bi, bw = tuple(forward), tuple(backward_input), tuple(backward_weight)
    if speeds is not None and not callable(speeds):
        speeds = tuple(float(x) for x in speeds)
        if len(speeds) != stages or not all(0 < x < math.inf for x in speeds):
            raise ValueError(f"speeds={speeds!r}: expected one finite speed > 0 per number of computing ranks "
                             f"(1..{stages})")
    if stages == 1:
        work = microbatches * (f[0] + bi[0] + bw[0])
        alone = speeds(0, frozenset({0})) if callable(speeds) else speeds[0] if speeds is not None else 1.0
        shared = work / alone
        return PipelineTime(shared, work, 0.0, "simulator", 0, shared - work)
    dedicated = _pipeline_makespan(schedule_kind, stages, microbatches, chunks, f, bi, bw, p2p, simulation_limit)
    if speeds is None:
        return dedicated
    shared = _pipeline_makespan(schedule_kind, stages, microbatches, chunks, f, bi, bw, p2p, simulation_limit,
                                speeds)
    return PipelineTime(shared.makespan, dedicated.work, dedicated.bubble, shared.source, shared.simulated_microbatches,
                        shared.makespan - dedicated.makespan)


def _pipeline_makespan(schedule_kind: str, stages: int, microbatches: int, chunks: int, f: Tuple[float, ...],
                       bi: Tuple[float, ...], bw: Tuple[float, ...], p2p: float, simulation_limit: int,
                       speeds=None) -> PipelineTime:
    """`pipeline_makespan` for stages > 1 at the given speeds (None: speed 1)."""
    layout = rank_stages(schedule_kind, stages, chunks)
    per_rank = [sum(f[s] + bi[s] + bw[s] for s in layout[r]) for r in range(stages)]
    busiest = max(range(stages), key=lambda r: per_rank[r])
    work = microbatches * per_rank[busiest]
    v_shaped = schedule_kind in ("zb_v", "dualpipe_v")
    m_sim = min(microbatches, 2 * stages if v_shaped else stages)
    if schedule_kind == "interleaved_1f1b" and microbatches % stages:
        raise ValueError(f"microbatches={microbatches}: 'interleaved_1f1b' needs a multiple of pipeline={stages}")
    if (v_shaped and microbatches <= m_sim + stages) or speeds is not None:  # shared cores: no steady period
        m_sim = microbatches
    simulated = m_sim + (stages if v_shaped and m_sim < microbatches else 0)
    if stages * simulated <= simulation_limit:
        makespan = _simulated(schedule_kind, stages, m_sim, chunks, f, bi, bw, p2p, speeds)
        slope = per_rank[busiest]
        if simulated > m_sim:  # V shapes: the steady period of p micro-batches, measured
            slope = (_simulated(schedule_kind, stages, simulated, chunks, f, bi, bw, p2p) - makespan) / stages
        makespan += (microbatches - m_sim) * slope
        return PipelineTime(makespan, work, makespan - work, "simulator", simulated)
    from mindspore_hyper.schedule.formulas import published_idle

    mine = layout[busiest]
    idle = published_idle(schedule_kind, stages, chunks, sum(f[s] for s in mine), sum(bi[s] for s in mine),
                          sum(bw[s] for s in mine))
    idle += 2 * (stages - 1) * p2p  # the warm-up's and cool-down's transfers lie on the critical path
    everyone = frozenset(range(stages))
    full = 1.0 if speeds is None else min(speeds(r, everyone) for r in everyone) if callable(speeds) else speeds[-1]
    makespan = (work + idle) / full
    return PipelineTime(makespan, work, makespan - work, "formula", 0)
