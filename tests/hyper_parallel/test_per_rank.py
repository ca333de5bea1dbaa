"""The per-rank simulation (`mindspore-hyper run --devices N --per-rank`): a script that builds
rank-specific pieces runs once per simulated device, the threads taking turns; and how the
plain simulation refuses such a script."""
import os
import subprocess
import sys
import textwrap

import pytest

from mindspore_hyper.hyper_parallel import RankDependentError
from mindspore_hyper.hyper_parallel.rank_threads import PerRankDeadlock, run_per_rank, simulated_communication
from mindspore_hyper.hyper_parallel.session import refuse_in_simulation

HERE = os.path.dirname(os.path.abspath(__file__))
CLI = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")


def test_the_msrun_pipeline_script_runs_unchanged_once_per_rank():
    script = os.path.join(HERE, "pipeline_script.py")  # the script test_pipeline_stage_msrun.py runs under msrun
    done = subprocess.run([CLI, "run", "--devices", "2", "--per-rank", script], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank}: pipeline 1F1B trains 3 Adam steps like one device" in done.stdout
        assert f"rank {rank}: pipeline GPipe equals one device" in done.stdout
    plain = subprocess.run([CLI, "run", "--devices", "2", script], capture_output=True, text=True, timeout=240)
    assert plain.returncode == 1
    with open(script) as f:
        line = next(i for i, text in enumerate(f, 1) if text.startswith("rank, size = get_rank()"))
    assert f"pipeline_script.py:{line}: mindspore.communication.get_rank() differs per device" in plain.stderr
    assert "--per-rank" in plain.stderr
    both = subprocess.run([CLI, "run", "--processes", "2", "--per-rank", script], capture_output=True, text=True,
                          timeout=240)
    assert both.returncode != 0 and "--per-rank: under msrun (--processes) each process is one rank" in both.stderr


def per_rank(tmp_path, body, devices=2):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    with simulated_communication(devices, refuse_in_simulation):
        return run_per_rank(str(script), devices)


PIPELINE = textwrap.dedent("""
    import numpy as np
    from mindspore import Tensor, nn
    from mindspore.communication import get_rank, get_group_size
    from mindspore_hyper.hyper_parallel import PipelineStage, Schedule1F1B, get_rank as api_rank
    rank = get_rank()
    print(f"rank {rank} of {get_group_size()}, API rank {api_rank()}")
    schedule = Schedule1F1B(PipelineStage(nn.Dense(4, 4), rank, 2), 2)
""")


def test_ranks_answer_their_own_rank_and_a_mismatched_schedule_is_a_named_deadlock(fresh_session, tmp_path, capsys):
    fresh_session.set_context(device_num=2)
    # rank 1 never runs its schedule: rank 0 waits for its gradient for ever
    with pytest.raises(PerRankDeadlock, match="rank 0 waits for 'gradient s1->s0 mb0' from rank 1, and no rank can"):
        per_rank(tmp_path, PIPELINE + "if rank == 0:\n    schedule.run(Tensor(np.ones((2, 4), np.float32)))\n")
    out = capsys.readouterr().out
    assert "rank 0 of 2, API rank 0" in out and "rank 1 of 2, API rank 1" in out


def test_a_failing_rank_stops_the_run_with_its_error(fresh_session, tmp_path):
    fresh_session.set_context(device_num=2)
    with pytest.raises(KeyError, match="boom") as failure:
        per_rank(tmp_path, PIPELINE + "if rank == 1:\n    raise KeyError('boom')\n"
                                      "schedule.run(Tensor(np.ones((2, 4), np.float32)))\n")
    assert "raised by rank 1 of the per-rank simulation" in str(failure.value.__notes__)
    assert per_rank(tmp_path, "import sys\nfrom mindspore.communication import get_rank\n"
                              "sys.exit(3 if get_rank() == 1 else 0)\n") == 3


def test_dtensors_are_refused_in_a_per_rank_run(fresh_session, tmp_path):
    fresh_session.set_context(device_num=2)
    with pytest.raises(RankDependentError, match="this script runs once per rank"):
        per_rank(tmp_path, """
            import numpy as np
            from mindspore import Tensor
            from mindspore_hyper.hyper_parallel import Shard, distribute_tensor, init_device_mesh
            mesh = init_device_mesh("cpu", (2,))
            distribute_tensor(Tensor(np.ones((2, 2), np.float32)), mesh, [Shard(0)])
        """)
    with pytest.raises(RankDependentError, match=r"script\.py:3: a DeviceMesh's DTensors .* runs once per rank"):
        per_rank(tmp_path, """
            from mindspore_hyper.hyper_parallel import init_device_mesh
            init_device_mesh("cpu", (2,)).get_rank()
        """)
