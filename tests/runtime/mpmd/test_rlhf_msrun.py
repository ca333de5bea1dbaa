"""The RLHF PPO step under msrun: each process runs its group's roles, phase results cross groups
point-to-point; the numbers equal the roles run one after another; disjoint groups overlap in
the measured timeline, colocated roles time-share."""
import json
import os

import pytest

from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rlhf_worker.py")
ROLES = [["actor", "reference"], ["actor", "reference"], ["critic"], ["reward_model"]]


def overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.msrun
def test_ppo_on_4_processes_equals_roles_one_after_another(tmp_path):
    proc = run_msrun(WORKER, [tmp_path], 4, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 4)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, res in enumerate(results):
        assert res["roles"] == ROLES[rank]
        assert len(res["steps"]) == 3
        for step in res["steps"]:
            assert step["sequences_equal"]
            assert step["got"] == pytest.approx(step["want"], rel=1e-5, abs=1e-7)
            assert step["advantage_error"] < 1e-5
        names = set(res["param_error"])
        assert names and all(n.split(".")[0] in ROLES[rank] for n in names)
        assert max(res["param_error"].values()) < 1e-5, res["param_error"]
        # only this process's roles ran here; every other unit's result was received
        runs = {e[2] for e in res["events"] if e[4] == "run"}
        assert runs == set(ROLES[rank])
        assert {e[2] for e in res["events"] if e[4] == "receive"} == \
            {"actor", "reference", "critic", "reward_model"} - set(ROLES[rank])
    everyone = sorted([r, e[0], e[3], e[4], e[5]] for r, res in enumerate(results) for e in res["events"])
    assert all(res["gathered"] == everyone for res in results)  # ProcessPhases.gather
    assert max(results[0]["actor_moved"].values()) > 0  # the actor trained away from the frozen reference

    def interval(rank, step, label):
        (e,) = [e for e in results[rank]["events"] if e[0] == step and e[3] == label and e[4] == "run"]
        return e[5], e[6]

    for step in range(3):
        # colocated: the reference waits for the actor's own pass on the same processes
        assert interval(0, step, "reference logp")[0] >= interval(0, step, "old logp")[1]
        # each process computes its scoring unit before waiting for any other group's
        for rank in range(4):
            events = [e for e in results[rank]["events"] if e[0] == step and e[1] == "scoring"]
            kinds = [e[4] for e in events]
            assert kinds == sorted(kinds, key=lambda k: k != "run"), events
    # measured concurrency of disjoint groups (real start/end per process; at least one of the 3
    # steps, as processes of this shared machine may be descheduled)
    assert any(overlap(interval(0, s, "old logp"), interval(2, s, "values")) and
               overlap(interval(2, s, "values"), interval(3, s, "score")) for s in range(3))
    assert any(overlap(interval(0, s, "actor update"), interval(2, s, "critic update")) for s in range(3))
