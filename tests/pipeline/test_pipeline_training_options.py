"""PipelineModel speaks ParallelModel's step protocol: `train_step(max_grad_norm=...)` clips to the
global norm over every stage as single-device `mindspore.ops.clip_by_global_norm` does (the norm,
then several steps of training, on a chain of MindSpore nn.Dense / nn.LayerNorm layers and on the
examples' PipelinedGPT; a tied weight counted once; the msrun counting rule summed over every
process's view); `loss_scale` trains like no scaling and skips an overflowing step; accumulation and
bad options are refused with messages that say what to do; `report()` is a StepReport with a
pipeline section; `last_gradients` are the single device's."""
import math
import os
import sys
import types

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, amp, nn, ops

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.pipeline import PipelineModel
from mindspore_hyper.pipeline.global_grad_norm import local_square_sum
from mindspore_hyper.pipeline.report import PipelineSection
from mindspore_hyper.runtime.report import StepReport
from pipeline_models import tokens
from tolerances import U32, gamma, gradient_tolerance, reduction_length, training_rtol

PIPELINE_2 = Layout((2,), ("pipeline",))
DTP = Layout((2, 2, 2), ("data", "tensor", "pipeline"))
LR, MOMENTUM, STEPS = 0.1, 0.9, 3

pytestmark = pytest.mark.usefixtures("pynative")


def norm_chain(seed: int = 0, shared: bool = False) -> nn.WithLossCell:
    """MindSpore layers in a chain: Dense, LayerNorm, Tanh, Dense, LayerNorm, ReLU, Dense, under
    MSELoss. `shared`: the middle Dense runs twice (one Parameter on two stages: tied)."""
    ms.set_seed(seed)
    middle = nn.Dense(16, 16)
    layers = [nn.Dense(8, 16), nn.LayerNorm((16,)), nn.Tanh(), middle, nn.LayerNorm((16,)), nn.ReLU()]
    layers += [middle, nn.Tanh()] if shared else []
    return nn.WithLossCell(nn.SequentialCell(layers + [nn.Dense(16, 4)]), nn.MSELoss())


def chain_batch(seed: int):
    rng = np.random.default_rng(seed)
    return (Tensor(rng.standard_normal((8, 8)).astype(np.float32)),
            Tensor(rng.standard_normal((8, 4)).astype(np.float32)))


def pipelined_gpt(seed: int = 0):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
    from models import PipelinedGPT

    ms.set_seed(seed)
    return PipelinedGPT(vocab=32, hidden=16, heads=2, layers=2, seq=8)


def pipelined(model, mesh, kind="1f1b", m=4, **options):
    mh.set_context(mode="simulation", device_num=mesh.size)
    strategy = mesh(tensor_map=("tensor",) if "tensor" in mesh.alias_names else ())
    return mh.auto_parallelize(model, strategy, pipeline=dict(schedule=kind, microbatches=m, **options))


def exact_norm(grads) -> float:
    """The global norm in float64 (the exact value of float32 gradients, up to float64 rounding)."""
    return math.sqrt(sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in grads))


def mindspore_norm(grads) -> float:
    """The global norm as ops.clip_by_global_norm computes it (float32 square sums, AddN, Sqrt)."""
    return float(ops.sqrt(ops.addn([ops.square(Tensor(g)).sum().reshape((1,)) for g in grads])).asnumpy()[0])


def norm_rtol(grads) -> float:
    """How far MindSpore's float32 norm may lie from the exact one: a sum of n positive squares in
    float32 is within gamma(n) relative of its value in any order (n = the largest tensor's size
    plus the AddN of the tensors), the squares add 1 u each, the square root halves the relative
    error and adds 1 u (Higham, ch. 3)."""
    n = max(np.asarray(g).size for g in grads) + len(grads) + 1
    return gamma(n) / 2 + 2 * U32


def single_device_clipped(model, batches, max_norm: float):
    """Plain MindSpore training: value_and_grad, ops.clip_by_global_norm, nn.Momentum; per step
    the loss, the gradients (numpy, by parameter name) and their exact global norm."""
    names, params = zip(*[(n, p) for n, p in model.parameters_and_names() if p.requires_grad])
    step = ms.value_and_grad(model, None, list(params))
    optimizer = nn.Momentum(list(params), LR, MOMENTUM)
    start = {n: p.asnumpy().copy() for n, p in zip(names, params)}
    losses, grads, norms = [], [], []
    for batch in batches:
        loss, g = step(*batch)
        losses.append(float(loss.asnumpy()))
        grads.append({n: x.asnumpy() for n, x in zip(names, g)})
        norms.append(exact_norm(grads[-1].values()))
        optimizer(ops.clip_by_global_norm(g, max_norm))
    return losses, grads, norms, start, {n: p.asnumpy().copy() for n, p in zip(names, params)}


def trained_parameters(parallel):
    """Parameter name (the model's path, as last_gradients) -> value."""
    return {n: p.asnumpy() for n, p in parallel.network.parameters_and_names() if p.requires_grad}


def assert_clipped_training_matches(reference, parallel, batches, max_norm: float, tokens_per_batch: int):
    """`parallel` trained with max_grad_norm on `batches` against `reference` (single_device_clipped
    on a twin model with the same weights): the first step's gradients within their float32
    tolerance, its norm equal to the exact norm of the pipeline's own gradients (float64 sums) and
    to MindSpore's float32 norm of them within `norm_rtol`, and to the single device's within the
    gradients' tolerance; every step's loss and norm, and the trained parameters, within the
    training bound (tests/tolerances.py)."""
    ref_losses, ref_grads, ref_norms, start, ref_params = reference
    names = list(ref_params)
    reduction = reduction_length(parallel.network.trainable_params(), tokens_per_batch)
    optimizer = nn.Momentum(parallel.optimizer_parameters(), LR, MOMENTUM)
    assert ref_norms[0] > max_norm  # the clipping acts
    for step, batch in enumerate(batches):
        loss = float(parallel.train_step(optimizer, *batch, max_grad_norm=max_norm).asnumpy())
        rtol = training_rtol(reduction, step + 1)
        assert loss == pytest.approx(ref_losses[step], rel=rtol)
        assert parallel.last_grad_norm == pytest.approx(ref_norms[step], rel=rtol)
        assert not parallel.last_step_skipped
        if step == 0:
            assert set(parallel.last_gradients) == set(names)
            tol = gradient_tolerance([ref_grads[0][n] for n in names], reduction)
            for n, t in zip(names, tol):
                assert np.all(np.abs(parallel.last_gradients[n] - ref_grads[0][n]) <= t), n
            own = [parallel.last_gradients[n] for n in names]
            assert parallel.last_grad_norm == pytest.approx(exact_norm(own), rel=1e-12)
            assert parallel.last_grad_norm == pytest.approx(mindspore_norm(own), rel=norm_rtol(own))
            assert abs(parallel.last_grad_norm - ref_norms[0]) <= math.sqrt(sum(float(np.sum(t ** 2)) for t in tol))
    rtol = training_rtol(reduction, len(batches))
    trained = trained_parameters(parallel)
    for name in names:
        err = np.linalg.norm(trained[name] - ref_params[name])
        moved = np.linalg.norm(ref_params[name] - start[name])
        assert err <= rtol * moved + 4 * U32 * np.linalg.norm(ref_params[name]), (name, err, moved)


@pytest.mark.parametrize("mesh, kind", [(PIPELINE_2, "1f1b"), (PIPELINE_2, "interleaved_1f1b"), (DTP, "zb_h1")],
                         ids=["pipeline2-1f1b", "pipeline2-interleaved", "data2xtensor2xpipeline2-zb_h1"])
def test_clipping_over_the_stages_equals_single_device(mesh, kind):
    batches = [chain_batch(seed) for seed in range(STEPS)]
    reference = single_device_clipped(norm_chain(), batches, max_norm=0.1)
    parallel = pipelined(norm_chain(), mesh, kind)
    assert isinstance(parallel, PipelineModel)
    assert_clipped_training_matches(reference, parallel, batches, 0.1, tokens_per_batch=8)


def test_clipping_the_examples_pipelined_gpt_equals_single_device():
    batches = [tokens(seed=seed) for seed in range(STEPS)]
    reference = single_device_clipped(pipelined_gpt(), batches, max_norm=0.5)
    parallel = pipelined(pipelined_gpt(), PIPELINE_2, "1f1b", m=2)
    assert_clipped_training_matches(reference, parallel, batches, 0.5, tokens_per_batch=32)


def test_a_weight_shared_by_two_stages_is_counted_once():
    """The middle Dense runs on stage 0 and stage 1: its gradient is the sum of the two stages'
    parts, counted once (adding each stage's squares would differ)."""
    batches = [chain_batch(seed) for seed in range(STEPS)]
    reference = single_device_clipped(norm_chain(shared=True), batches, max_norm=0.1)
    parallel = pipelined(norm_chain(shared=True), PIPELINE_2, "1f1b", layers_per_stage=(4, 5))
    shared = {id(p) for p in parallel.stage_cells[0].trainable_params()} & \
        {id(p) for p in parallel.stage_cells[1].trainable_params()}
    assert len(shared) == 2  # the middle Dense's weight and bias on both stages
    assert_clipped_training_matches(reference, parallel, batches, 0.1, tokens_per_batch=8)
    per_stage = sum(float(np.sum(np.asarray(g.asnumpy(), np.float64) ** 2))
                    for c in parallel.computations.values() for g in c.grads.values())
    assert abs(math.sqrt(per_stage) - parallel.last_grad_norm) > 1e-3 * parallel.last_grad_norm


def test_each_msrun_process_counts_its_shards_once():
    """What every process of an msrun job on data 2 x tensor 2 x pipeline 2 would add (its stages'
    gradient shards, where it is the shard's first replica on the stage mesh) sums, over the 8
    processes, to the global squared norm; adding every process's shards would count the data
    replicas twice."""
    parallel = pipelined(norm_chain(), DTP, "1f1b")
    parallel.train_step(nn.SGD(parallel.optimizer_parameters(), 0.0), *chain_batch(0))
    grads = {id(p): parallel.last_gradients[name] for name, p in parallel.network.parameters_and_names()}
    want = exact_norm(grads.values()) ** 2
    mesh, a = parallel.mesh, parallel.mesh.axis_index("pipeline")
    total, replicated = 0.0, 0.0
    for g in mesh.ranks:
        coords = mesh.coords(g)
        rest = tuple(c for i, c in enumerate(coords) if i != a)
        stage_rank = int(np.ravel_multi_index(rest, parallel.stage_mesh.device_matrix))
        held = parallel.schedule.stages_of(coords[a])
        views, shards = {}, {}
        for s in held:
            rows = parallel.stage_models[s].rows
            views[s] = types.SimpleNamespace(rows=rows, local_ranks=(stage_rank,))
            for pid, row in rows.items():
                shards[pid] = Tensor(grads[pid][row.layout.rank_slices(stage_rank, row.global_shape)])
        process = types.SimpleNamespace(in_one_process=False, stage_models=views)
        total += local_square_sum(process, shards)
        replicated += sum(float(np.sum(s.asnumpy().astype(np.float64) ** 2)) for s in shards.values())
    assert total == pytest.approx(want, rel=1e-12)
    assert replicated == pytest.approx(2 * want, rel=1e-12)  # the data axis holds every shard twice


def test_static_loss_scale_trains_like_no_scale():
    """A power-of-two scale is exact in float32 here (no overflow, no underflow): the same losses,
    gradients, norms and parameters as without scaling (equal up to the rounding of the unscaling
    multiply)."""
    runs = {}
    for scale in (None, 2.0 ** 10):
        parallel = pipelined(norm_chain(), PIPELINE_2, "1f1b")
        optimizer = nn.Momentum(parallel.optimizer_parameters(), LR, MOMENTUM)
        losses = [float(parallel.train_step(optimizer, *chain_batch(s), loss_scale=scale).asnumpy())
                  for s in range(2)]
        runs[scale] = (losses, parallel.last_grad_norm, dict(parallel.last_gradients), trained_parameters(parallel))
        assert not parallel.last_step_skipped
    (plain_losses, plain_norm, plain_grads, plain_params), (losses, norm, grads, params) = runs[None], runs[2.0 ** 10]
    assert losses == plain_losses  # the forward is not scaled
    assert norm == pytest.approx(plain_norm, rel=4 * U32)
    for name, want in plain_grads.items():
        np.testing.assert_allclose(grads[name], want, rtol=2 * U32, atol=0, err_msg=name)
        np.testing.assert_allclose(params[name], plain_params[name], rtol=8 * U32, atol=8 * U32, err_msg=name)


def test_dynamic_loss_scale_skips_an_overflowing_step_and_lowers_the_scale():
    scaler = amp.DynamicLossScaler(2.0 ** 16, 2, 1)
    parallel = pipelined(norm_chain(), PIPELINE_2, "1f1b")
    optimizer = nn.Momentum(parallel.optimizer_parameters(), LR, MOMENTUM)
    start = {p.name: p.asnumpy().copy() for p in parallel.network.trainable_params()}
    x, y = chain_batch(0)
    poisoned = x.asnumpy().copy()
    poisoned[7, 3] = np.inf  # a sample of the last microbatch: every gradient becomes nan
    parallel.train_step(optimizer, Tensor(poisoned), y, loss_scale=scaler, max_grad_norm=1.0)
    assert parallel.last_step_skipped and not math.isfinite(parallel.last_grad_norm)
    for p in parallel.network.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), start[p.name], err_msg=f"{p.name} updated by a skipped step")
    assert float(scaler.scale_value.asnumpy()) == 2.0 ** 15  # divided by scale_factor
    loss = float(parallel.train_step(optimizer, x, y, loss_scale=scaler).asnumpy())
    assert not parallel.last_step_skipped and math.isfinite(loss) and math.isfinite(parallel.last_grad_norm)
    assert all(not np.array_equal(p.asnumpy(), start[p.name]) for p in parallel.network.trainable_params())
    assert float(scaler.scale_value.asnumpy()) == 2.0 ** 16  # scale_window=1 finite step: raised again


def test_accumulation_and_bad_options_are_refused_before_anything_runs():
    parallel = pipelined(norm_chain(), PIPELINE_2, "1f1b", m=2)
    optimizer = nn.SGD(parallel.optimizer_parameters(), LR)
    before = {p.name: p.asnumpy().copy() for p in optimizer.parameters}
    cases = [(dict(accumulation_steps=3), r"accumulation_steps=3 is not supported by the pipeline model: a pipeline "
                                          r"already accumulates its microbatches' gradients before one update; for "
                                          r"the same update pass the 3 batches concatenated to one train_step with 6 "
                                          r"microbatches \(pipeline=dict\(microbatches=6\)\)"),
             (dict(accumulation_steps=0), r"accumulation_steps=0: expected an int >= 1"),
             (dict(max_grad_norm=0), r"max_grad_norm=0: expected a finite number > 0"),
             (dict(max_grad_norm=float("nan")), r"max_grad_norm=nan: expected a finite number > 0"),
             (dict(loss_scale=0.5), r"loss_scale=0.5: expected None, a number >= 1, or a mindspore.amp loss scaler")]
    for option, match in cases:
        with pytest.raises(ValueError, match=match):
            parallel.train_step(optimizer, *chain_batch(0), **option)
    assert parallel.steps_run == 0
    assert all(np.array_equal(p.asnumpy(), before[p.name]) for p in optimizer.parameters)  # nothing ran


def test_a_dry_run_refuses_clipping_and_loss_scaling():
    mh.set_context(mode="dryrun", device_num=4)
    parallel = mh.auto_parallelize(norm_chain(), Layout((2, 2), ("data", "pipeline"))(tensor_map=()),
                                   pipeline=dict(schedule="1f1b", microbatches=2))
    optimizer = nn.SGD(parallel.optimizer_parameters(), LR)
    with pytest.raises(ValueError, match=r"dry run: train_step option\(s\) \['max_grad_norm', 'loss_scale'\] are "
                                         r"not modelled by the dry run"):
        parallel.train_step(optimizer, *chain_batch(0), max_grad_norm=1.0, loss_scale=8.0)
    parallel.train_step(optimizer, *chain_batch(0))  # without them: the shapes run


def test_report_is_a_step_report_with_the_pipeline_section():
    parallel = pipelined(norm_chain(), DTP, "1f1b", m=2)
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-3)
    parallel.train_step(optimizer, *chain_batch(0))
    report = parallel.report(optimizer)
    assert type(report) is StepReport and isinstance(report.pipeline, PipelineSection)
    section = report.pipeline
    assert (section.schedule, section.ranks, section.chunks, section.microbatches) == ("1f1b", 2, 1, 2)
    assert section.split == tuple(parallel.split) and sum(section.split) == 7
    boundary = section.p2p["stage 0->1"]
    assert boundary["activation_count"] == 2 and boundary["activation_bytes"] == 2 * 4 * 16 * 4  # 2 x (4, 16) f32
    assert report.p2p is section.p2p and report.timeline is section.timeline and section.timeline.makespan > 0
    text = str(report)
    assert "pipeline: 1f1b, 2 ranks x 1 chunk(s), 2 microbatches" in text and "stage 0->1" in text
    assert report.to_dict()["pipeline"]["p2p"] == section.p2p
    assert len(report.memory) == 8 and any("@stage" in a for axes in report.comm_backward.values() for a in axes)


def test_report_lists_the_norm_all_reduce_over_the_whole_mesh():
    """The global norm adds each device's squared-norm share over all 8 devices of the mesh: one
    AllReduce of one float64 per device (8 bytes in, the ring's 2(n-1)/n x 8 = 14 bytes sent for
    n = 8), caused "clip grad norm" when the step clips and "grad norm" when it only keeps the norm."""
    for max_grad_norm, cause in ((0.05, "clip grad norm"), (None, "grad norm")):
        parallel = pipelined(norm_chain(), DTP, "1f1b", m=2)
        optimizer = nn.SGD(parallel.optimizer_parameters(), LR)
        for seed in range(2):  # the report lists the last step's
            parallel.train_step(optimizer, *chain_batch(seed), max_grad_norm=max_grad_norm)
        report = parallel.report(optimizer)
        assert report.comm_backward["AllReduce"]["data+tensor+pipeline"] == {"count": 1, "bytes": 14,
                                                                             "input_bytes": 8}
        assert report.comm_causes["backward"]["AllReduce"]["data+tensor+pipeline"] == {cause: 1}
    parallel(*chain_batch(0))  # a forward-only step computes no norm
    assert "data+tensor+pipeline" not in parallel.report(optimizer).comm_backward.get("AllReduce", {})
