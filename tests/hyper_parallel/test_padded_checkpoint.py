"""Checkpoints of pieces stored padded (`dtensor/padded_storage.py`): under msrun `fully_shard`
stores each process's torch.chunk piece as it is, and one zero row where the piece is empty (more
devices than pieces of rows). The checkpoint holds the real rows only, so it equals one saved in
simulation, and a load writes the real rows and leaves the padding zero.

The four processes of such a job are four threads here, each with the holdings that process has
(its pieces, padded as fully_shard pads them under msrun) and a job communicator that sums their
rows; the 4-process msrun job checks the real thing (tests/hyper_parallel/rank_checks.py). Values
are copied bytes, so every comparison is exact."""
import dataclasses
import threading

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.holdings import Holdings
from mindspore_hyper.hyper_parallel import init_device_mesh
from mindspore_hyper.hyper_parallel.checkpoint import StateDict, load, save
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.session import reset_session

X = Tensor(np.random.RandomState(0).randn(4, 4).astype(np.float32))
PROCESSES = 4


class Narrow(nn.Cell):
    """5 and 3 output rows over 4 devices: torch.chunk pieces 2, 2, 1, 0 and 1, 1, 1, 0 (padded)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(4, 5), nn.Dense(5, 3)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


def _model(devices, shard=True):
    reset_session()
    mh.set_context(device_num=devices)
    model = Narrow()
    if shard:
        fully_shard(model, mesh=init_device_mesh("npu", (devices,), mesh_dim_names=("dp",)))
    return model, nn.Adam(model.trainable_params(), learning_rate=1e-2)


def _state(model, optimizer):
    return {"model": model.parameters_dict(), "optim": optimizer.parameters_dict()}


def _values(model, optimizer):
    return {f"{section}.{name}": p.asnumpy().copy() for section, params in _state(model, optimizer).items()
            for name, p in params.items()}


class _Job:
    """The job's communicator for threads standing for its processes: `all_reduce` sums every
    thread's array (each thread calls it the same number of times, as msrun's processes do)."""

    def __init__(self):
        self.barrier = threading.Barrier(PROCESSES)
        self._arrays = {}

    def all_reduce(self, array):
        self._arrays[threading.get_ident()] = np.array(array)
        self.barrier.wait()
        total = sum(self._arrays.values())
        self.barrier.wait()  # every thread has summed before the next call replaces its array
        return total


class _Process:
    """What process `rank` of the msrun job holds of a model (its `checkpoint_holdings()`): each
    laid-out tensor's piece, stored as fully_shard stores it under msrun (one zero row for an empty
    piece), the rest whole."""

    def __init__(self, simulated: Holdings, rank: int, job: _Job):
        self.holdings, self.tensors = simulated, []
        for t in simulated.tensors:
            box = t.box(rank)
            piece = t.param.asnumpy()[box.within(Box.full(t.global_shape))]
            stored = 1 if t.global_shape and box.shape[0] == 0 else None
            if stored is not None:
                piece = np.concatenate([piece, np.zeros((stored - piece.shape[0],) + piece.shape[1:], piece.dtype)])
            param = Parameter(Tensor(piece.copy()), name=t.param.name)
            self.tensors.append(dataclasses.replace(t, param=param, held=box, stored_rows=stored))
        self.rank, self.job = rank, job

    def checkpoint_holdings(self) -> Holdings:
        return Holdings(self.holdings.mesh, "distributed", (self.rank,), list(self.tensors), None, self.job)


def _run_job(job: _Job, work):
    """`work(rank)` in one thread per process of `job`; the lead's (rank 0's) result."""
    results, errors = {}, []

    def run(rank):
        try:
            results[rank] = work(rank)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)
            job.barrier.abort()  # the other threads stop waiting for this one

    threads = [threading.Thread(target=run, args=(r,)) for r in range(PROCESSES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results[0]


def test_padded_pieces_save_their_real_rows_and_load_with_zero_padding(tmp_path):
    model, optimizer = _model(PROCESSES)
    optimizer(ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None, optimizer.parameters)(X)[1])
    values, output = _values(model, optimizer), model(X).asnumpy()
    simulated = save(_state(model, optimizer), checkpoint_id=tmp_path / "simulated")
    held = StateDict(_state(model, optimizer)).checkpoint_holdings()

    job = _Job()
    processes = [_Process(held, r, job) for r in range(PROCESSES)]
    manifest = _run_job(job, lambda r: mh.save_checkpoint(processes[r], tmp_path / "msrun"))
    padded = [p for p in processes[3].tensors if p.stored_rows is not None]
    assert {t.name for t in padded} >= {"model.up.weight", "model.down.weight", "optim.moment1.down.bias"}
    # the stored shards are the real rows only: the same boxes as the simulation's (no empty, no padded ones)
    assert manifest.mode == "distributed"
    for name, entry in simulated.parameters.items():
        assert [s.box for s in manifest.parameters[name].shards] == [s.box for s in entry.shards], name
    assert [(s.box.start[0], s.box.stop[0]) for s in manifest.parameters["model.up.weight"].shards] == [
        (0, 2), (2, 4), (4, 5)]
    # and their values: both checkpoints load into one device and into 3 devices as the trained model
    for devices, shard in ((1, False), (3, True)):
        for path in ("simulated", "msrun"):
            plain, plain_optimizer = _model(devices, shard)
            load(_state(plain, plain_optimizer), checkpoint_id=tmp_path / path)
            got = _values(plain, plain_optimizer)
            for name, value in values.items():
                np.testing.assert_array_equal(got[name], value, err_msg=f"{path} at {devices}: {name}")
            np.testing.assert_array_equal(plain(X).asnumpy(), output)

    # a load into padded pieces (saved on one device: another world size) writes the real rows and
    # zeros the padding (set to 7 before, as stale values would be)
    plain, plain_optimizer = _model(1, shard=False)
    load(_state(plain, plain_optimizer), checkpoint_id=tmp_path / "msrun")
    save(_state(plain, plain_optimizer), checkpoint_id=tmp_path / "one")
    job = _Job()
    targets = [_Process(held, r, job) for r in range(PROCESSES)]
    for target in targets:
        for t in target.tensors:  # the real rows too: the load must write them
            t.param.set_data(Tensor(np.full(t.param.shape, 7, t.param.asnumpy().dtype)))
    _run_job(job, lambda r: mh.load_checkpoint(targets[r], tmp_path / "one"))
    for target, reference in zip(targets, processes):
        for t, expected in zip(target.tensors, reference.tensors):
            np.testing.assert_array_equal(t.param.asnumpy(), expected.param.asnumpy(), err_msg=t.name)
            if t.stored_rows is not None:
                assert t.param.shape[0] == t.stored_rows and not t.param.asnumpy()[t.held.shape[0]:].any()
