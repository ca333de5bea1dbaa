"""The RLHF PPO step under msrun: each process runs its group's roles, phase results cross groups
point-to-point; the numbers equal the roles run one after another; disjoint groups overlap in
the measured timeline, colocated roles time-share. With `scheduler: dynamic`, the frozen roles'
scoring rows are shared between the groups and the shares move between steps (every process
agreeing), with the same numbers. rlhf_worker.py's job runs in the 4-process launch of
test_mpmd_msrun.py (conftest.py's `mpmd_4_processes`)."""
import pytest

ROLES = [["actor", "reference"], ["actor", "reference"], ["critic"], ["reward_model"]]
ALL = {"actor", "reference", "critic", "reward_model"}


def overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.fixture(scope="module")
def results(mpmd_4_processes):
    """Each rank's rlhf_worker.py results."""
    return mpmd_4_processes["rlhf"]


def run_interval(results: list, run: str, step: int, rank: int, label: str) -> tuple:
    """(start, end) in seconds of the unit `label` that process `rank` ran in `step` of `run`;
    for a unit split by rows (the dynamic run's frozen roles), the span of its row blocks."""
    spans = [(e[5], e[6]) for e in results[rank][run]["events"]
             if e[0] == step and e[4] == "run" and (e[3] == label or e[3].startswith(label + " rows"))]
    assert spans, (run, step, rank, label)
    return min(s for s, _ in spans), max(e for _, e in spans)


def check_numbers(res: dict, rank: int, steps: int) -> None:
    """The trainer's steps equal ppo_step on bare Cells; this process's roles' parameters too."""
    assert res["roles"] == ROLES[rank]
    assert len(res["steps"]) == steps
    for step in res["steps"]:
        assert step["sequences_equal"]
        assert step["got"] == pytest.approx(step["want"], rel=1e-5, abs=1e-7)
        assert step["advantage_error"] < 1e-5
    names = set(res["param_error"])
    assert names and all(n.split(".")[0] in ROLES[rank] for n in names)
    assert max(res["param_error"].values()) < 1e-5, res["param_error"]
    if "actor" in res["roles"]:  # the actor trained away from the frozen reference
        assert max(res["actor_moved"].values()) > 0


def check_gathered(runs: list) -> None:
    everyone = sorted([r, e[0], e[3], e[4], e[5]] for r, res in enumerate(runs) for e in res["events"])
    assert all(res["gathered"] == everyone for res in runs)  # ProcessPhases.gather


@pytest.mark.msrun
def test_ppo_on_4_processes_equals_roles_one_after_another(results):
    runs = [r["static"] for r in results]
    for rank, res in enumerate(runs):
        check_numbers(res, rank, 3)
        # only this process's roles ran here; every other unit's result was received
        assert {e[2] for e in res["events"] if e[4] == "run"} == set(ROLES[rank])
        assert {e[2] for e in res["events"] if e[4] == "receive"} == ALL - set(ROLES[rank])
    check_gathered(runs)

    def interval(rank, step, label):
        return run_interval(results, "static", step, rank, label)

    for step in range(3):
        # colocated: the reference waits for the actor's own pass on the same processes
        assert interval(0, step, "reference logp")[0] >= interval(0, step, "old logp")[1]
        # each process computes its scoring units before waiting for any other group's
        for rank in range(4):
            kinds = [e[4] for e in runs[rank]["events"] if e[0] == step and e[1] == "scoring"]
            assert kinds == sorted(kinds, key=lambda k: k != "run"), kinds
    # measured concurrency of disjoint groups (real start/end per process). Processes of this
    # shared machine may be descheduled for a whole unit, so each pair must overlap in at least
    # one of the 7 steps of both runs (static and dynamic; a unit split by rows counts as its span).
    steps = [(run, s) for run, count in (("static", 3), ("dynamic", 4)) for s in range(count)]

    def overlapping(first, second):
        return any(overlap(run_interval(results, run, s, *first), run_interval(results, run, s, *second))
                   for run, s in steps)

    assert overlapping((0, "old logp"), (2, "values"))
    assert overlapping((0, "actor update"), (2, "critic update"))
    assert overlapping((2, "values"), (3, "score"))


@pytest.mark.msrun
def test_dynamic_row_shares_move_between_steps_with_the_same_numbers(results):
    runs = [r["dynamic"] for r in results]
    for rank, res in enumerate(runs):
        check_numbers(res, rank, 4)
    check_gathered(runs)
    # every process applied the same shares in every step, and made the same decisions
    assert all(res["share_history"] == runs[0]["share_history"] for res in runs)
    assert all(res["decisions"] == runs[0]["decisions"] for res in runs)
    groups, history = runs[0]["share_groups"], runs[0]["share_history"]
    assert groups == ["actor", "critic", "reward"] and history[0] == [4, 2, 2]  # rows by group size 2:1:1
    assert all(sum(h) == 8 and min(h) >= 1 for h in history)
    hand = [d for d in runs[0]["decisions"] if d[4] == "applied by hand"]
    assert [d[0] for d in hand] == [2] and history[2] != history[1] and hand[0][2] == history[2]
    for step, before, after, _, note in runs[0]["decisions"]:
        if note == "":  # the planner's, after `step` steps: from the shares used, to those of the next step
            assert history[step - 1] == before
            assert history[step] == after or step == hand[0][0]
    # in each step each group's leader computed its block of both frozen units, the others received it
    leaders = {"actor": 0, "critic": 2, "reward": 3}
    for step in range(4):
        start = 0
        for group, share in zip(groups, history[step]):
            part = f"rows {start}-{start + share - 1}"
            for rank, res in enumerate(runs):
                kinds = {(e[3], e[4]) for e in res["events"] if e[0] == step}
                kind = "run" if rank == leaders[group] else "receive"
                assert (f"score {part}", kind) in kinds and (f"reference logp {part}", kind) in kinds, (step, rank)
            start += share
