"""HyperMPMD on the seed's multimodal config: text encoder, vision encoder and fusion layer on
their own device groups (configs/multimodal_process_groups.yaml, scaled from 193 to 7 simulated
devices with the same proportions), `scheduler: dynamic` moving devices between the groups.
Checks the training (clipped to a global gradient norm over the groups) against one device and
prints the step's report with its MPMD section: the per-group timeline (PNG / Chrome trace with
--timeline DIR).

    .venv/bin/python examples/mpmd_multimodal.py [--steps 4] [--timeline docs/img]
"""
import argparse
import os

import numpy as np
import mindspore as ms
from mindspore import nn, ops

import mindspore_hyper as mh
from mindspore_hyper.mpmd import scale_groups
from mindspore_hyper.strategy.config import load_parallel_config

MAX_GRAD_NORM = 0.5  # global-norm clipping over the three groups, as ops.clip_by_global_norm on one device
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "multimodal_process_groups.yaml")


class Multimodal(nn.Cell):
    """32 captions (2 per image) and 16 images per step, as the seed's batch sizes."""

    def __init__(self, hidden=32):
        super().__init__()
        self.text_encoder = nn.SequentialCell(nn.Dense(8, hidden), nn.GELU(), nn.Dense(hidden, hidden), nn.GELU(),
                                              nn.Dense(hidden, hidden))
        self.vision_encoder = nn.SequentialCell(nn.Dense(12, hidden), nn.Tanh(), nn.LayerNorm((hidden,)))
        self.fusion_layer = nn.Dense(2 * hidden, 4)
        self.hidden = hidden

    def construct(self, text, image, target):
        pooled = self.text_encoder(text).reshape(image.shape[0], -1, self.hidden).mean(1)
        out = self.fusion_layer(ops.concat((pooled, self.vision_encoder(image)), -1))
        return ((out - target) ** 2).mean()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--timeline", default=None, help="directory for mpmd_multimodal_timeline.png / .json")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True, device_num=7)
    config = scale_groups(load_parallel_config(CONFIG), 7)

    ms.set_seed(0)
    net = Multimodal()
    ms.set_seed(0)
    ref = Multimodal()
    model = mh.auto_parallelize(net, config)
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=1e-2)
    ref_opt = nn.Adam(ref.trainable_params(), learning_rate=1e-2)
    ref_grad = ms.value_and_grad(ref, None, ref.trainable_params())
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        batch = (ms.Tensor(rng.standard_normal((32, 8)).astype(np.float32)),
                 ms.Tensor(rng.standard_normal((16, 12)).astype(np.float32)),
                 ms.Tensor(rng.standard_normal((16, 4)).astype(np.float32)))
        loss = float(model.train_step(opt, *batch, max_grad_norm=MAX_GRAD_NORM))  # the norm over every group
        ref_loss, grads = ref_grad(*batch)
        ref_opt(ops.clip_by_global_norm(grads, MAX_GRAD_NORM))
        groups = ", ".join(f"{n} {len(p.ranks)}" for n, p in model.placements().items())
        print(f"step {step}: loss {loss:.6f} (one device {float(ref_loss):.6f}), gradient norm "
              f"{model.last_grad_norm:.4f}; devices: {groups}")
        np.testing.assert_allclose(loss, float(ref_loss), rtol=1e-5)
    print(f"dynamic scheduler, last decision: {model.rebalancing.last_plan.reason}")
    for record in model.rebalances:
        print(f"after step {record.step}: {'applied' if record.applied else 'not applied'}: {record.plan.reason}"
              + (f" ({record.note})" if record.note else ""))
    for p, q in zip(net.trainable_params(), ref.trainable_params()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=p.name)
    report = model.report(opt)  # the last training step: memory and communication per device, and the MPMD
    # section (report.mpmd): forward and backward per group, cross-group bytes
    print(report)
    if args.timeline:
        os.makedirs(args.timeline, exist_ok=True)
        report.mpmd.timeline.plot(os.path.join(args.timeline, "mpmd_multimodal_timeline.png"),
                                  title="seed multimodal config on 7 simulated devices: one training step")
        report.mpmd.timeline.to_chrome_trace(os.path.join(args.timeline, "mpmd_multimodal_timeline.json"))
    print(f"OK: {args.steps} steps on the seed's device groups match one device")


if __name__ == "__main__":
    main()
