"""`AsyncContextParallel`: upstream's overlapped context parallelism has `ContextParallel`'s values
(loss and every gradient equal one device), with or without the q/k/v projections, its output
local or a sequence-split DTensor; partial projections are refused."""
import numpy as np
import pytest
from mindspore import Tensor, nn

from mindspore_hyper.hyper_parallel import DTensor, Shard, distribute_module, distribute_tensor, init_device_mesh
from mindspore_hyper.hyper_parallel.async_context_parallel import AsyncContextParallel

from test_context_parallel_style import (
    ATOL, CP, RTOL, ScaledAttention, _inputs, _loss_and_grads,
)


class KeptOutputAttention(ScaledAttention):
    """ScaledAttention whose core returns a DTensor (use_local_output=False) used as it is."""

    def construct(self, q, k, v):
        out = self.core(q * self.wq, k * self.wk, v * self.wv)
        assert isinstance(out, DTensor) and out.placements == (Shard(1),)
        return ((out * self.wo) ** 2).mean().full_tensor()


@pytest.mark.parametrize("degree", [None, 1], ids=["ulysses", "all-gathered-kv"])
@pytest.mark.parametrize("local, projections", [(True, False), (True, True), (False, True)],
                         ids=["local-sync-fallback", "local-with-projections", "dtensor-output"])
def test_async_context_parallel_equals_one_device(fresh_session, degree, local, projections):
    arrays = _inputs()
    expected_loss, expected_grads = _loss_and_grads(ScaledAttention(), [Tensor(a) for a in arrays])
    fresh_session.set_context(device_num=CP)
    mesh = init_device_mesh("npu", (CP,), mesh_dim_names=("cp",))
    model = ScaledAttention(mesh) if local else KeptOutputAttention(mesh)
    distribute_module(model, mesh)
    proj = dict(q_proj=nn.Identity(), k_proj=nn.Identity(), v_proj=nn.Identity()) if projections else {}
    AsyncContextParallel(ulysses_degree=degree, use_local_output=local).apply(model.core, mesh, **proj)
    loss, grads = _loss_and_grads(model, [distribute_tensor(Tensor(a), mesh, (Shard(1),)) for a in arrays])
    np.testing.assert_allclose(loss, expected_loss, rtol=RTOL)
    for got, want in zip(grads, expected_grads):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_async_context_parallel_refuses_partial_projections(fresh_session):
    fresh_session.set_context(device_num=CP)
    mesh = init_device_mesh("npu", (CP,), mesh_dim_names=("cp",))
    with pytest.raises(ValueError, match="pass q_proj, k_proj and v_proj together"):
        AsyncContextParallel().apply(nn.Identity(), mesh, q_proj=nn.Identity())
    with pytest.raises(ValueError, match="k_proj must be an nn.Cell"):
        AsyncContextParallel().apply(nn.Identity(), mesh, q_proj=nn.Identity(), k_proj=len, v_proj=nn.Identity())
    with pytest.raises(ValueError, match="use_local_output must be a bool"):
        AsyncContextParallel(use_local_output=None)
    with pytest.raises(ValueError, match="hybrid"):
        AsyncContextParallel(ulysses_degree=2).apply(nn.Identity(), mesh)
