"""A small model around an MoE layer, used by the expert-parallel tests and the example."""
import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.moe import MoE


class MoENet(nn.Cell):
    """Dense -> MoE (residual) -> Dense, loss = MSE + the router's auxiliary loss."""

    def __init__(self, hidden=16, ffn=24, experts=8, top_k=2, shared=0, capacity_factor=None, routing_bits=False,
                 overlap_chunks=1, dispatch="flat", expert_groups=None):
        super().__init__()
        self.inp = nn.Dense(hidden, hidden)
        self.moe = MoE(hidden, ffn, num_experts=experts, top_k=top_k, capacity_factor=capacity_factor,
                       aux_loss_coef=0.01, z_loss_coef=1e-3, shared_ffn_hidden=shared, routing_bits=routing_bits,
                       overlap_chunks=overlap_chunks, dispatch=dispatch, expert_groups=expert_groups)
        self.out = nn.Dense(hidden, hidden)

    def construct(self, x, target):
        h = self.inp(x)
        y, aux = self.moe(h)
        pred = self.out(h + y)
        return ((pred - target) ** 2).mean() + aux


def copy_weights(src, dst):
    for p, q in zip(src.get_parameters(), dst.get_parameters()):
        q.set_data(p.data.copy())


def batches(steps, batch=8, seq=4, hidden=16, seed=0):
    rng = np.random.default_rng(seed)
    return [(Tensor(rng.normal(size=(batch, seq, hidden)).astype(np.float32)),
             Tensor(rng.normal(size=(batch, seq, hidden)).astype(np.float32))) for _ in range(steps)]


def expert_strategy(mesh, tensor=False):
    """Experts split over "expert"; with `tensor`, their F over "tensor" and the shared expert
    Megatron-style (gate/up by output, down by input)."""
    strategy = mesh(tensor_map=())
    if tensor:
        strategy.override("*.experts.w_gate", "expert", None, "tensor").override("*.experts.w_up", "expert", None, "tensor")
        strategy.override("*.experts.w_down", "expert", "tensor", None)
        strategy.override("*.shared.gate.*", "tensor").override("*.shared.up.*", "tensor")
        strategy.override("*.shared.down.weight", None, "tensor")
    else:
        strategy.override("*.experts.*", "expert")
    return strategy
