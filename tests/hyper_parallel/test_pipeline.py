"""HyperParallel's PipelineStage and schedules: every pipeline rank's schedule run in this
process (`run_ranks_in_process`: the runner and stages of an msrun job, over in-process
transfers) against one device running the same layers; MetaStep orders; the refusals.

Tolerances: the pipeline runs the same float32 ops as one device on row blocks of the batch; the
values differ only by the order of sums (a mean over 2 rows instead of 8, gradients summed over
4 microbatches instead of one matmul over 8 rows). Reassociating a sum of n float32 terms moves
it by at most about n * 2**-24 of the sum of magnitudes; with n <= 8 and values O(1) that is
below 1e-6, so rtol=1e-5 / atol=1e-6 has a margin of ~10x and still catches any wrong term.
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    BatchDimSpec, MetaStep, MetaStepType, PipelineStage, RankDependentError, Schedule1F1B, ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from mindspore_hyper.hyper_parallel.pipeline_schedule import run_ranks_in_process
from pipeline_layers import Block, Head

RTOL, ATOL = 1e-5, 1e-6
STAGES, M, BATCH = 4, 4, 8


def make_layers(seed=0):
    ms.set_seed(seed)
    model = nn.CellList([Block() for _ in range(STAGES - 1)] + [Head()])  # unique Parameter names, for Adam
    return list(model)


def copy_of(layers):
    """Fresh layers holding the same values (the one-device reference)."""
    twin = make_layers(seed=1)
    for a, b in zip(layers, twin):
        for p, q in zip(a.trainable_params(), b.trainable_params()):
            q.set_data(Tensor(p.asnumpy()))
    return twin


def batch(seed=0):
    return Tensor(np.random.RandomState(seed).randn(BATCH, 8).astype(np.float32))


def schedules(layers, cls, chunks=1, micro=M, **kwargs):
    """One schedule per pipeline rank: rank r holds stages r, r + p, ... (each its own Cell)."""
    ranks = STAGES // chunks
    out = []
    for r in range(ranks):
        stages = [PipelineStage(layers[s], s, STAGES) for s in range(r, STAGES, ranks)]
        out.append(cls(stages if chunks > 1 else stages[0], micro, **kwargs))
    return out


def one_device(layers, x):
    """One device: the step's objective is the sum of the microbatches' losses (upstream seeds
    each microbatch's output with ones), i.e. M times the mean loss over the whole batch."""
    params = [p for layer in layers for p in layer.trainable_params()]

    def step(x):
        h = x
        for layer in layers:
            h = layer(h)
        return h * M

    loss, grads = ms.value_and_grad(step, None, params)(x)
    per_micro = []
    for part in ops.split(x, BATCH // M, axis=0):
        h = part
        for layer in layers:
            h = layer(h)
        per_micro.append(float(h.asnumpy()))
    return float(loss.asnumpy()), grads, per_micro


def params_of(layers):
    return [p for layer in layers for p in layer.trainable_params()]


@pytest.mark.parametrize("cls, chunks", [(ScheduleGPipe, 1), (Schedule1F1B, 1), (ScheduleInterleaved1F1B, 2)])
def test_loss_and_gradients_equal_one_device(cls, chunks):
    layers = make_layers()
    twin = copy_of(layers)
    x = batch()
    outputs = run_ranks_in_process(schedules(layers, cls, chunks), x)
    loss, grads, per_micro = one_device(twin, x)
    assert len(outputs) == M
    np.testing.assert_allclose([float(o.asnumpy()) for o in outputs], per_micro, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(sum(float(o.asnumpy()) for o in outputs), loss, rtol=RTOL, atol=ATOL)
    for p, g in zip(params_of(layers), grads):
        np.testing.assert_allclose(p.grad.asnumpy(), g.asnumpy(), rtol=RTOL, atol=ATOL, err_msg=p.name)


def test_adam_steps_equal_one_device_and_grads_accumulate_until_cleared():
    layers = make_layers()
    twin = copy_of(layers)
    params, twin_params = params_of(layers), params_of(twin)
    opt, twin_opt = nn.Adam(params, learning_rate=0.05), nn.Adam(twin_params, learning_rate=0.05)
    scheds = schedules(layers, Schedule1F1B)
    for step in range(3):
        x = batch(seed=step)
        outputs = run_ranks_in_process(scheds, x)
        opt(tuple(p.grad for p in params))
        loss, grads, _ = one_device(twin, x)
        twin_opt(grads)
        np.testing.assert_allclose(sum(float(o.asnumpy()) for o in outputs), loss, rtol=RTOL, atol=ATOL)
        for p in params:
            p.grad = None
    # Adam's update is about lr per step whatever the gradient's size, so the weights after 3
    # steps agree to the same float32 reassociation bound as the gradients' signs allow
    for p, q in zip(params, twin_params):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=RTOL, atol=1e-5, err_msg=p.name)
    x = batch(seed=9)
    run_ranks_in_process(scheds, x)
    once = [p.grad.asnumpy().copy() for p in params]
    run_ranks_in_process(scheds, x)  # not cleared: added, as upstream's .grad accumulates
    for p, g in zip(params, once):
        np.testing.assert_allclose(p.grad.asnumpy(), 2 * g, rtol=RTOL, atol=ATOL)


def test_several_inputs_with_batch_dims():
    """Stage 0 takes (x transposed, batch on dim 1) and a scale that is not split (-1)."""
    layers = make_layers()
    twin = copy_of(layers)

    class First(nn.Cell):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def construct(self, xt, scale):
            return self.block(xt.T, scale)

    stage_cells = [First(layers[0])] + layers[1:]
    x, scale = batch(), Tensor(np.float32(0.5))
    scheds = [Schedule1F1B(PipelineStage(stage_cells[s], s, STAGES), M,
                           args_batch_dim=[BatchDimSpec(1), BatchDimSpec(-1)]) for s in range(STAGES)]
    outputs = run_ranks_in_process(scheds, x.T, scale)
    h = twin[0](x, scale)
    for layer in twin[1:]:
        h = layer(h)
    np.testing.assert_allclose(sum(float(o.asnumpy()) for o in outputs), M * float(h.asnumpy()), rtol=RTOL, atol=ATOL)


def test_exec_order_speaks_meta_steps():
    layers = make_layers()
    sched = Schedule1F1B(PipelineStage(layers[0], 0, 2), 2)
    F, B, FS, BR = MetaStepType.FWD, MetaStepType.BWD, MetaStepType.FWD_SEND, MetaStepType.BWD_RECV
    # rank 0 of 1F1B over 2 ranks, 2 microbatches: one warm-up forward, then F/B pairs
    assert sched.exec_order[0] == [MetaStep(0, F, 0), MetaStep(0, FS, 0), MetaStep(1, F, 0), MetaStep(1, FS, 0),
                                   MetaStep(0, BR, 0), MetaStep(0, B, 0), MetaStep(1, BR, 0), MetaStep(1, B, 0)]
    receiver = [s.type for s in sched.exec_order[1]]
    assert receiver[:2] == [MetaStepType.FWD_RECV, F] and MetaStepType.BWD_SEND in receiver
    assert len({MetaStep(0, F, 0), MetaStep(0, F, 0)}) == 1
    with pytest.raises(TypeError, match="meta_type must be a MetaStepType"):
        MetaStep(0, "FWD", 0)
    with pytest.raises(ValueError, match="hand-made MetaStep order is not supported"):
        sched.exec_order = {}


def test_run_in_simulation_names_the_script_line():
    sched = Schedule1F1B(PipelineStage(make_layers()[0], 0, 2), 2)
    with pytest.raises(RankDependentError, match=r"test_pipeline\.py:\d+: Schedule1F1B\.run\(\) runs one rank's "
                                                 r".*--processes 2"):
        sched.run(batch())


def test_bad_schedules_and_inputs_are_refused():
    layers = make_layers()
    stage0 = PipelineStage(layers[0], 0, STAGES)
    with pytest.raises(ValueError, match="micro_batch_num must be a positive int"):
        ScheduleGPipe(stage0, 0)
    with pytest.raises(ValueError, match=r"Schedule1F1B with 4 pipeline ranks and micro_batch_num=2: .*num_micro"):
        Schedule1F1B(stage0, 2)
    with pytest.raises(ValueError, match="ScheduleInterleaved1F1B with 2 pipeline ranks and micro_batch_num=3"):
        ScheduleInterleaved1F1B([stage0, PipelineStage(layers[2], 2, STAGES)], 3)
    with pytest.raises(ValueError, match="ScheduleGPipe runs one stage per rank, but got 2"):
        ScheduleGPipe([stage0, PipelineStage(layers[2], 2, STAGES)], 4)
    with pytest.raises(ValueError, match=r"expected \[0, 2\]"):
        ScheduleInterleaved1F1B([stage0, PipelineStage(layers[1], 1, STAGES)], 4)
    with pytest.raises(TypeError, match="stages must be a PipelineStage"):
        ScheduleGPipe([layers[0]], 4)
    with pytest.raises(ValueError, match="kwargs_batch_dim"):
        ScheduleGPipe(stage0, 4, kwargs_batch_dim={"x": BatchDimSpec(0)})
    with pytest.raises(ValueError, match="output_concat_dim"):
        ScheduleGPipe(stage0, 4, output_concat_dim=0)
    with pytest.raises(TypeError, match="args_batch_dim must be a list or tuple of BatchDimSpec"):
        ScheduleGPipe(stage0, 4, args_batch_dim=[0])
    scheds = schedules(layers, ScheduleGPipe)
    with pytest.raises(ValueError, match="micro_batch_num=4 does not divide input 0's batch dimension 0 .size 6"):
        run_ranks_in_process(scheds, Tensor(np.ones((6, 8), np.float32)))
    with pytest.raises(ValueError, match="inputs given on pipeline rank 1"):
        scheds[1]._microbatches((batch(),), {})
    with pytest.raises(ValueError, match="this rank holds stage 0, which takes the step's inputs"):
        scheds[0]._microbatches((), {})
    with pytest.raises(ValueError, match=r"keyword inputs \(\['x'\]\)"):
        scheds[0]._microbatches((), {"x": batch()})
    from mindspore_hyper.hyper_parallel import Replicate, distribute_tensor, init_device_mesh

    dt = distribute_tensor(Tensor(np.ones((6, 8), np.float32)), init_device_mesh("cpu", (1,)), [Replicate()])
    with pytest.raises(ValueError, match="micro_batch_num=4 does not divide input 0's batch dimension 0 on every "
                                         "device"):
        scheds[0]._microbatches((dt,), {})


def test_unsupported_stage_options_are_refused():
    cell = make_layers()[0]
    with pytest.raises(ValueError, match="stage_index=4 must lie in 0..stage_num-1"):
        PipelineStage(cell, 4, 4)
    with pytest.raises(TypeError, match="submodule must be an nn.Cell"):
        PipelineStage(lambda x: x, 0, 2)
    with pytest.raises(ValueError, match="group= .a custom pipeline process group. is not supported"):
        PipelineStage(cell, 0, 2, group="pp")
    with pytest.raises(ValueError, match="dst_stage=3: only the neighbouring stage"):
        PipelineStage(cell, 0, 4, dst_stage=3)
    with pytest.raises(ValueError, match="has_backward=False"):
        PipelineStage(cell, 0, 2, has_backward=False)
    with pytest.raises(ValueError, match="shared_parameters"):
        PipelineStage(cell, 0, 2, shared_parameters=[])


def test_a_stage_returning_several_tensors_is_refused():
    class Pair(nn.Cell):
        def construct(self, x):
            return x, x

    scheds = [ScheduleGPipe(PipelineStage(Pair() if s == 0 else Head(), s, 2), 2) for s in range(2)]
    with pytest.raises(ValueError, match="PipelineStage 0: its Cell returned tuple; a stage returns one Tensor or "
                                         "DTensor"):
        run_ranks_in_process(scheds, batch())
