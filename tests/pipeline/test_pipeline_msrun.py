"""Pipeline execution under msrun: zb_h1 on 4 processes and 1f1b on tensor 2 x pipeline 2 (with
global-norm clipping over the stages' processes and tensor shards) train like one device (losses,
grad norms and each process's stage parameters, or their shards, after 5 Adam steps), the tensor x
pipeline case reporting the simulation's memory and step memory series; a receive
that waits too long names the peer rank. (1f1b on 2 processes: the example's
msrun test in tests/examples; data 2 x pipeline 2 was run the same way, see docs/mpmd.md.)"""
import threading

import mindspore as ms
import numpy as np
import pytest

from pipeline_models import batch, dense_chain, gpt, single_device_clipped_run, single_device_run, tokens
from tolerances import assert_adam_training_close, reduction_length, training_rtol

@pytest.mark.msrun
@pytest.mark.parametrize("kind, workers, mesh", [("zb_h1", 4, "pipeline"), ("1f1b", 4, "tensor")])
def test_distributed_pipeline_trains_like_one_device(kind, workers, mesh, pipeline_4_processes):
    """Both runs in one 4-process job (conftest.py's `pipeline_4_processes`)."""
    folder, options = pipeline_4_processes[f"{kind}-{mesh}"]
    clip = options.get("clip")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    x, y = batch()
    model = dense_chain()
    if clip is None:
        losses, params = single_device_run(model, x, y)
        norms = None
    else:
        losses, params, norms = single_device_clipped_run(model, x, y, clip)
        assert norms[0] > clip > norms[-1]  # both sides of the limit
    eval_loss = float(model(x, y).asnumpy())  # the trained model's forward-only loss
    reduction = reduction_length(model.trainable_params(), 64)  # Adam-aware bounds: tests/tolerances.py
    rtol = training_rtol(reduction, len(losses))
    seen = set()
    for rank in range(workers):
        out = np.load(folder / f"rank{rank}.npz")
        np.testing.assert_allclose(out["losses"], losses, rtol=rtol)
        np.testing.assert_allclose(float(out["eval_loss"]), eval_loss, rtol=rtol)
        if norms is not None:  # the same norm on every process: every stage's and tensor shard's squares once
            np.testing.assert_allclose(out["grad_norms"], norms, rtol=rtol)
        for key in out.files:
            if key.startswith("param:"):
                name = key[len("param:"):]
                want = params[name]
                if f"region:{name}" in out.files:  # a tensor-parallel shard
                    want = want[tuple(slice(a, b) for a, b in out[f"region:{name}"])]
                    assert want.size < params[name].size
                assert_adam_training_close(out[key], want, 1e-2, len(losses), reduction, err_msg=name)
                seen.add(name)
    assert seen == set(params)  # every parameter lives on exactly one of the processes
    assert (folder / "measured_trace.json").exists()
    if mesh == "tensor":
        check_step_memory_like_simulation(folder, workers, kind, clip)


def check_step_memory_like_simulation(folder, workers, kind, clip):
    """Each process's memory row (parameters and optimizer states of its stage's shards: a stage's
    own Parameters under msrun are named within the stage), step memory series (its pipeline rank's,
    pipeline/pipeline_step_memory.py) and step peaks equal the numeric simulation's of the same step
    on tensor 2 x pipeline 2, byte for byte (every step has the same shapes: the worker's last step
    has the first step's figures), and so does the report's row of the clipping norm's all-reduce."""
    import json

    import mindspore_hyper as mh
    from mindspore import nn

    try:
        mh.set_context(mode="simulation", device_num=workers)
        parallel = mh.auto_parallelize(dense_chain(), mh.Layout((2, workers // 2), ("tensor", "pipeline"))(
            tensor_map=("tensor",)), pipeline={"schedule": kind, "microbatches": 4})
        optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
        parallel.train_step(optimizer, *batch(), max_grad_norm=clip)
        report = parallel.report(optimizer)
        simulated = json.loads(json.dumps({"step_memory": report.step_memory, "memory": report.memory}))
        simulated_norm = report.comm_backward["AllReduce"]["tensor+pipeline"]
    finally:
        mh.reset_context()
    for rank in range(workers):
        got = json.loads(str(np.load(folder / f"rank{rank}.npz")["step_memory"]))
        assert got["memory"] == {str(rank): simulated["memory"][str(rank)]}  # parameters, optimizer states, ...
        # the clipping norm's float64 sum over the 4 processes: 8 bytes in, the ring's 2(n-1)/n x 8 = 12 sent
        assert got["norm_row"] == simulated_norm == {"count": 1, "bytes": 12, "input_bytes": 8}
        assert got["norm_causes"] == {"clip grad norm": 1}
        step = got["step_memory"]
        (pipeline_rank,) = step["per_pipeline_rank"]
        assert step["per_pipeline_rank"][pipeline_rank] == simulated["step_memory"]["per_pipeline_rank"][pipeline_rank]
        assert step["timeline"] == simulated["step_memory"]["per_pipeline_rank"][pipeline_rank]["timeline"]
        assert step["per_device"] == {str(rank): simulated["step_memory"]["per_device"][str(rank)]}


@pytest.mark.msrun
def test_distributed_pipeline_of_a_construct_with_a_side_input(pipeline_2_processes):
    """examples/models.py GPT on 2 processes (1f1b), pipelined through its construct: each
    process recomputes the mask side input; losses and each process's stage parameters after 5
    Adam steps equal one device's (the job of test_pipeline_rebalance.py's msrun test,
    conftest.py's `pipeline_2_processes`)."""
    folder, _ = pipeline_2_processes["gpt"]
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = gpt(layers=2)
    losses, params = single_device_run(model, *tokens(), lr=1e-3)
    reduction = reduction_length(model.trainable_params(), 64)  # Adam-aware bounds: tests/tolerances.py
    seen = set()
    for rank in range(2):
        out = np.load(folder / f"rank{rank}.npz")
        np.testing.assert_allclose(out["losses"], losses, rtol=training_rtol(reduction, len(losses)))
        for key in out.files:
            if key.startswith("param:"):
                name = key[len("param:"):]
                # the key bias's gradient is exactly 0: all rounding noise, held to Adam's displacement bound
                assert_adam_training_close(out[key], params[name], 1e-3, len(losses), reduction, err_msg=name,
                                           noise_only=name.endswith("qkv.bias"))
                seen.add(name)
    assert seen == set(params)  # the embeddings train on stage 0, the final norm and head on stage 1


def test_a_receive_that_waits_too_long_names_the_peer():
    from mindspore_hyper.pipeline.stage_transport import Mailbox, P2PTimeout
    from mindspore_hyper.schedule.actions import P2PTensor, Payload

    box = Mailbox(rank=1)
    key = P2PTensor(Payload.ACTIVATION, 0, 1, 3)
    with pytest.raises(P2PTimeout, match=r"rank 1: no 'activation s0->s1 mb3' from rank 0 within 0.2 s"):
        box.take(key, peer=0, timeout=0.2)
    threading.Timer(0.05, box.put, (key, 7)).start()
    assert box.take(key, peer=0, timeout=5.0) == 7
