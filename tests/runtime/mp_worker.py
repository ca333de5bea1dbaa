"""msrun worker of tests/runtime/test_mixed_precision.py: MindSpore's amp O2 (float16, loss scaling)
with nn.Dropout and ops.dropout, data x tensor parallel in distributed mode, and the same model
trained on one device in this process; then amp O2 in bfloat16 with the CPU emulation against
tests/runtime/test_mixed_precision_bfloat16.py's hand-written reference; writes <out>/rank<r>.json."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/runtime/

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import Tensor, amp, nn, ops  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.runtime.distributed import world  # noqa: E402
from mindspore_hyper.shard import Layout  # noqa: E402

import test_mixed_precision as T  # noqa: E402


class DropBlock(T.Block):
    """The test's Block with nn.Dropout inside the MLP and ops.dropout on the residual stream."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(p=0.3)

    def construct(self, ids, labels):
        h = self.embed(ids)
        h = h + self.down(self.drop(self.act(self.up(self.norm(h)))))
        h = ops.dropout(h, 0.2)
        return self.loss(self.head(h).reshape(-1, 64), labels.reshape(-1))


def build():
    ms.set_seed(1)
    net = DropBlock()
    net.set_train()
    return amp.auto_mixed_precision(net, "O2", dtype=ms.float16)


def main():
    mh.set_context(mode="distributed")
    ref = build()
    ms.set_seed(9)  # ops.dropout's seeds come from the global seed's counter: both runs restart it
    ref_losses = T._train(ref, nn.Adam(ref.trainable_params(), learning_rate=T.LR), amp.StaticLossScaler(1024.0))
    strategy = Layout((2, T.TP), ("data", "tensor"))(tensor_map=())  # no ZeRO-1: a user's loop (see docs)
    strategy.override("*up.*", "tensor")
    strategy.override("*down.weight", None, "tensor")
    net = build()
    par = mh.auto_parallelize(net, strategy)
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=T.LR)
    ms.set_seed(9)
    losses = T._train(par, optimizer, amp.StaticLossScaler(1024.0))
    named = dict(ref.parameters_and_names())
    params = {}
    for name, p in net.parameters_and_names():
        want = named[name].asnumpy()[par.held_region(name)].astype(np.float64)
        params[name] = [float(np.linalg.norm(p.asnumpy() - want)), float(np.linalg.norm(want)),
                        float(np.abs(p.asnumpy() - want).max())]
    report = par.report(optimizer)
    rank = world().rank
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump({"losses": losses, "ref_losses": ref_losses, "params": params,
                   "memory_by_dtype": report.memory_by_dtype[rank], "memory": report.memory[rank],
                   "bfloat16": bfloat16_case(strategy), "bfloat16_dropout": bfloat16_dropout_case()}, f)


class Drop(nn.Cell):
    """MindSpore's Dropout primitive, seeds given: returns (output, mask)."""

    def __init__(self):
        super().__init__()
        self.drop = ops.Dropout(0.7, 5, 9)

    def construct(self, x):
        return self.drop(x)


def bfloat16_dropout_case():
    """A bfloat16 Dropout with the CPU emulation on data 2 x tensor 2 processes (batch and hidden
    split) against the float32 primitive with the same seeds on one device in this process: the
    same mask, and the output the float32 one rounded once to bfloat16 (both bitwise)."""
    mh.set_context(cpu_bfloat16="emulate")
    x = Tensor(np.random.default_rng(3).standard_normal((8, 4, 16)).astype(np.float32)).astype(ms.bfloat16)
    ref_out, ref_mask = Drop()(x.astype(ms.float32))  # bfloat16-exact values in float32
    par = mh.auto_parallelize(Drop(), Layout((2, T.TP), ("data", "tensor"))(tensor_map=(),
                                                                            input_map=("data", None, "tensor")))
    out, mask = par(x)
    rounded = ref_out.astype(ms.bfloat16).astype(ms.float32).asnumpy()
    return {"dtypes": [str(out.dtype), str(mask.dtype)], "dropped": float((ref_mask.asnumpy() == 0).mean()),
            "mask_equal": bool((mask.astype(ms.float32).asnumpy() == ref_mask.asnumpy()).all()),
            "rounded_once": bool((out.astype(ms.float32).asnumpy() == rounded).all())}


def bfloat16_case(strategy):
    """amp O2 in bfloat16 with the CPU emulation (no dropout: `bfloat16_dropout_case`), 5 Adam
    steps, against the hand-written float32 reference that rounds where bfloat16 does."""
    import test_mixed_precision_bfloat16 as B

    mh.set_context(cpu_bfloat16="emulate")
    ref = B._reference()
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=T.LR)
    ref_grad = ms.value_and_grad(ref, None, ref_opt.parameters)
    ms.set_seed(1)
    net = amp.auto_mixed_precision(T.Block(), "O2", dtype=ms.bfloat16)
    par = mh.auto_parallelize(net, strategy)
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=T.LR)
    losses, ref_losses = [], []
    for ids, labels in T.BATCH:
        losses.append(float(par.train_step(optimizer, ids, labels).asnumpy()))
        loss, grads = ref_grad(ids, labels)
        ref_opt(grads)
        ref_losses.append(float(loss.asnumpy()))
    named = {p.name: p for p in ref.trainable_params()}  # the amp model's paths start at its wrapper
    params = {}
    for name, p in net.parameters_and_names():
        want = named[p.name].asnumpy()[par.held_region(name)].astype(np.float64)
        params[name] = [float(np.linalg.norm(p.asnumpy() - want)), float(np.linalg.norm(want)),
                        float(np.abs(p.asnumpy() - want).max())]
    return {"losses": losses, "ref_losses": ref_losses, "params": params,
            "working_weights": par.report(optimizer).memory_by_dtype[world().rank]["working_weights"]}


if __name__ == "__main__":
    main()
