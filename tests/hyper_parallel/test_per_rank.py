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


def test_the_tensor_parallel_pipeline_script_runs_once_per_rank():
    """Upstream's vpp_schedule pattern (there 8 devices = 4 pipeline ranks x 2; here 4 = 2 x 2 to
    keep the test short: the script takes any even device count), each stage split over
    its 2 devices (Colwise/Rowwise, fully_shard, hsdp); every rank checks its stage's losses,
    gradients and weights itself."""
    script = os.path.join(HERE, "pipeline_tp_script.py")
    done = subprocess.run([CLI, "run", "--devices", "4", "--per-rank", script], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(4):
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline 1F1B trains 2 Adam steps like one device" in done.stdout
        assert f"rank {rank}: tensor-parallel (and GPipe) pipeline GPipe equals one device" in done.stdout
        assert f"rank {rank}: fully_shard pipeline 1F1B trains 1 Adam steps like one device" in done.stdout
        assert f"rank {rank}: hsdp pipeline 1F1B trains 1 Adam steps like one device" in done.stdout
        assert f"rank {rank}: hsdp accumulating pipeline 1F1B trains 1 Adam steps like one device" in done.stdout
        assert f"rank {rank}: DTensor activations pipeline 1F1B trains 2 Adam steps like one device" in done.stdout
        assert f"rank {rank}: DTensor activations pipeline GPipe equals one device (losses, gradients" in done.stdout
        assert f"rank {rank}: Partial DTensor activations pipeline GPipe equals one device" in done.stdout
        assert f"rank {rank}: interleaved DTensor activations pipeline Interleaved1F1B trains 1 Adam" in done.stdout
        assert f"rank {rank}: a Partial activation crosses to a stage without a laid-out Parameter" in done.stdout
    for ranks in ([0, 1], [2, 3]):  # one report per stage mesh, its 2 devices only
        assert done.stdout.count(f"mesh tp=2 on ranks {ranks} (HyperParallel API)") == 1


def test_each_rank_simulates_its_own_mesh_and_a_rank_outside_a_mesh_is_refused(fresh_session, tmp_path, capsys):
    fresh_session.set_context(device_num=4)
    per_rank(tmp_path, """
        import numpy as np
        from mindspore import Tensor
        from mindspore_hyper.hyper_parallel import DeviceMesh, Shard, distribute_tensor, init_device_mesh
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        x = distribute_tensor(Tensor(np.arange(8, dtype=np.float32).reshape(4, 2)), mesh, [Shard(0)])
        low = DeviceMesh("cpu", [0, 1])
        print(f"rank {mesh.get_rank()}: ranks {mesh.mesh.tolist()} coordinate {mesh.get_coordinate()} "
              f"sum {float((x * 2).sum())} outside {low.get_coordinate()}")
    """, devices=4)
    out = capsys.readouterr().out
    for rank in range(4):
        base = rank - rank % 2
        outside = [rank] if rank < 2 else None
        assert f"rank {rank}: ranks {[base, base + 1]} coordinate {[rank % 2]} sum 56.0 outside {outside}" in out
    with pytest.raises(ValueError, match=r"rank 2 is not in the DeviceMesh of ranks \[0, 1\].*get_coordinate\(\) is not"):
        per_rank(tmp_path, """
            import numpy as np
            from mindspore import Tensor
            from mindspore_hyper.hyper_parallel import DeviceMesh, Replicate, distribute_tensor
            distribute_tensor(Tensor(np.ones((2, 2), np.float32)), DeviceMesh("cpu", [0, 1]), [Replicate()])
        """, devices=4)
    with pytest.raises(RankDependentError, match=r"split_group\(\) is not simulated in a per-rank run"):
        per_rank(tmp_path, """
            from mindspore_hyper.hyper_parallel import split_group
            split_group(split_ranks=[[0, 1], [2, 3]])
        """, devices=4)
    with pytest.raises(ValueError, match=r"get_local_rank\(\): rank 3 is not in this mesh"):
        per_rank(tmp_path, """
            from mindspore.communication import get_rank
            from mindspore_hyper.hyper_parallel import DeviceMesh
            if get_rank() == 3:
                DeviceMesh("cpu", [0, 1]).get_local_rank()
        """, devices=4)


def test_a_stage_laid_out_beyond_its_pipeline_rank_s_devices_is_refused(fresh_session, tmp_path):
    fresh_session.set_context(device_num=4)
    with pytest.raises(ValueError, match="laid out on ranks \\[0, 1, 2, 3\\], outside its pipeline rank's ranks 0..1"):
        per_rank(tmp_path, """
            import numpy as np
            from mindspore import Tensor, nn
            from mindspore.communication import get_rank
            from mindspore_hyper.hyper_parallel import (
                ColwiseParallel, PipelineStage, Schedule1F1B, init_device_mesh, parallelize_module)
            rank = get_rank()
            cell = nn.SequentialCell([nn.Dense(4, 4)])
            parallelize_module(cell, init_device_mesh("cpu", (4,)), {"0": ColwiseParallel()})  # the whole job
            schedule = Schedule1F1B(PipelineStage(cell, rank // 2, 2), 2)
            schedule.run(Tensor(np.ones((2, 4), np.float32))) if rank < 2 else schedule.run()
        """, devices=4)
    with pytest.raises(ValueError, match="3 pipeline ranks do not divide the job's 4 devices"):
        per_rank(tmp_path, """
            import numpy as np
            from mindspore import Tensor, nn
            from mindspore.communication import get_rank
            from mindspore_hyper.hyper_parallel import PipelineStage, ScheduleGPipe
            stage = PipelineStage(nn.Dense(4, 4), min(get_rank(), 2), 3)
            ScheduleGPipe(stage, 2).run(*[Tensor(np.ones((2, 4), np.float32))] * stage.is_first_stage)
        """, devices=4)


def test_loss_backward_runs_once_per_rank_and_equals_one_device(fresh_session, tmp_path, capsys):
    """torch-style loss.backward() (enable_mindspore_backward_compat) in a per-rank run: each rank,
    its own batch, fully_shard with main_grad (one backward, sense 0.25) and Colwise/Rowwise, against
    one device's value_and_grad. Each rank's thread simulates its mesh's 2 devices, so a rank's plain
    batch stands for both (module docstring of rank_threads.py): one device's gradient on that batch.
    float32 sums of <= 8 terms in another order: ~1e-6 relative; the sense 0.25 scales exactly."""
    from mindspore_hyper.hyper_parallel.autograd_compat import disable_mindspore_backward_compat

    fresh_session.set_context(device_num=2)
    try:
        per_rank(tmp_path, """
            import numpy as np
            import mindspore as ms
            from mindspore import Tensor, nn, ops
            from mindspore.communication import get_rank
            from mindspore_hyper.hyper_parallel import (
                ColwiseParallel, MixedPrecisionPolicy, RowwiseParallel, enable_mindspore_backward_compat, fully_shard,
                init_device_mesh, parallelize_module,
            )

            class Mlp(nn.Cell):
                def __init__(self):
                    super().__init__()
                    self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

                def construct(self, x):
                    return self.down(ops.tanh(self.up(x)))

            rank = get_rank()
            rng = np.random.RandomState(rank)
            x, y = Tensor(rng.randn(4, 8).astype(np.float32)), Tensor(rng.randn(4, 8).astype(np.float32))
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
            policy = MixedPrecisionPolicy(reduce_dtype=ms.float32, apply_grad_on_fp32_main_grad=True)
            for style in ("fully_shard", "Colwise/Rowwise"):
                ms.set_seed(rank)
                model, reference = Mlp(), Mlp()
                for (_, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
                    q.set_data(Tensor(p.asnumpy()))
                if style == "fully_shard":
                    fully_shard(model, mesh=mesh, mp_policy=policy)
                else:
                    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
                enable_mindspore_backward_compat()
                ((model(x) - y) ** 2).mean().backward(Tensor(0.25, ms.float32))
                want = ms.value_and_grad(lambda x, y: ((reference(x) - y) ** 2).mean(), None,
                                         reference.trainable_params())(x, y)[1]
                for p, g in zip(model.trainable_params(), want):
                    got = [p.grad] + ([p.main_grad] if style == "fully_shard" else [])
                    for held in got:
                        np.testing.assert_allclose(held.asnumpy(), 0.25 * g.asnumpy(), rtol=1e-5, atol=1e-7,
                                                   err_msg=p.name)
                print(f"rank {rank}: {style} loss.backward() equals one device")
        """)
    finally:
        disable_mindspore_backward_compat()
    out = capsys.readouterr().out
    for rank in range(2):
        assert f"rank {rank}: fully_shard loss.backward() equals one device" in out
        assert f"rank {rank}: Colwise/Rowwise loss.backward() equals one device" in out
