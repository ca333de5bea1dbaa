"""Worker of the msrun tests: trains the example GPT in distributed mode for several steps and
the same GPT on one device (once per case, see msrun_cases.py), and writes what each rank saw to
JSON.

Usage (under msrun): dist_worker.py OUT_DIR CASE [CASE ...], a CASE being
"<data>x<tensor>[+zero]" (e.g. 2x2+zero) or "fail@<rank>" (that rank raises after one step,
prints the error and leaves with status 0 without closing anything, as a crashed process would:
msrun kills every worker as soon as one exits non-zero, which would race the survivors' own report;
so the survivors must notice the dead peer by themselves, and their failure is the job's), or
"options" (train_options_worker.py's case: clipping, accumulation and loss scaling on 2 x 2), or
"bf16" (tests/runtime/bfloat16_msrun_case.py: one emulated bfloat16 step on 2 x 2), or "cast_weights"
(tests/runtime/cast_weights_case.py: bfloat16 copies of float32 weights, data 4, 2 micro-batches).
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
sys.path.insert(0, os.path.join(ROOT, "tests"))  # msrun_cases
ms.set_context(mode=ms.PYNATIVE_MODE)
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from models import GPT  # noqa: E402
from msrun_cases import run_cases_and_write_results, train_reference  # noqa: E402

STEPS = 3
HEADS = 4
COLLECTIVE_THREADS = set()  # names of the threads that called MindSpore's collectives (mindspore transport)


def _record_collective_threads() -> None:
    """Wrap mint.distributed's collectives to record the calling thread's name: the mindspore
    transport must issue them all from the main thread, in program order (a background thread's
    collective beside the backward's made MindSpore fail with "AllReduce failed")."""
    import threading

    from mindspore.mint import distributed as dist

    def recorded(fn):
        def call(*args, **kwargs):
            COLLECTIVE_THREADS.add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather", "broadcast"):
        setattr(dist, name, recorded(getattr(dist, name)))


_record_collective_threads()


def megatron(data: int, tensor: int, zero: bool):
    s = Layout((data, tensor), ("data", "tensor"))(tensor_map=(), optimizer_state="data" if zero else None)
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def batches(n):
    rng = np.random.default_rng(1)
    return [(Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32)),
             Tensor(rng.integers(0, 128, (8, 16)).astype(np.int32))) for _ in range(n)]


def run_case(case: str):
    if case.startswith("fail@"):
        run_failing(int(case[5:]), sys.argv[1])  # exits the process
    if case == "options":  # test_train_options_msrun.py's case, in the same launch (conftest.py)
        from train_options_worker import run_case as run_options

        return run_options(case)
    if case == "cast_weights":  # bfloat16 copies of float32 weights on data 4 (tests/runtime/cast_weights_case.py)
        sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
        from cast_weights_case import run_case as run_cast_weights

        return run_cast_weights(case)
    if case == "bf16":  # one bfloat16 step on data 2 x tensor 2 (tests/runtime/bfloat16_msrun_case.py)
        sys.path.insert(0, os.path.join(ROOT, "tests", "runtime"))
        from bfloat16_msrun_case import run_case as run_bfloat16

        return run_bfloat16(case)
    dims, _, extra = case.partition("+")
    data, tensor = (int(v) for v in dims.split("x"))
    ms.set_seed(1)
    ref = GPT(vocab=128, hidden=64, heads=HEADS, layers=2, seq=16)
    model = GPT(vocab=128, hidden=64, heads=HEADS, layers=2, seq=16)
    for p, q in zip(ref.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    global_bytes = sum(p.asnumpy().nbytes for p in model.trainable_params())
    par = auto_parallelize(model, megatron(data, tensor, extra == "zero"))
    rank = par.local_ranks[0]
    out = {"rank": rank, "losses": [], "misuse": _misuse(par, model, extra == "zero")}
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=1e-3)
    for i, (ids, labels) in enumerate(batches(STEPS)):
        loss = par.train_step(optimizer, ids, labels)
        if i == 0:  # gradients of the first step, this rank's shards
            local_grads = {name: np.array(g) for name, g in par.last_gradients.items()}
        out["losses"].append(float(loss.asnumpy()))
    local = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    report = par.report(optimizer)
    out["memory"] = report.memory[rank]
    out["param_bytes_held"] = sum(p.asnumpy().nbytes for p in model.trainable_params())
    out["optimizer_bytes_held"] = sum(p.asnumpy().nbytes for p in optimizer.moment1) * 2
    out["global_param_bytes"] = global_bytes
    out["comm_backward"] = report.comm_backward
    out["comm_causes"] = report.comm_causes
    out["step_memory"] = report.step_memory  # the last step's memory over forward, backward and update
    from mindspore_hyper.runtime.distributed import world

    out["communicators"] = sorted({type(c).__name__ for c in world()._communicators.values()})
    out["collective_threads"] = sorted(COLLECTIVE_THREADS)
    out["cores"] = None if world().cores is None else sorted(world().cores)
    out["thread_cores"] = sorted({tuple(sorted(os.sched_getaffinity(int(t)))) for t in os.listdir("/proc/self/task")})

    def reference() -> dict:
        return train_reference(ref, nn.Adam(ref.trainable_params(), learning_rate=1e-3), batches(STEPS))

    def finish(expected: dict) -> dict:
        out["ref_losses"] = expected["losses"]
        out["grad_error"] = _errors(par, expected["grads"], local_grads, rank)
        out["param_error"] = _errors(par, expected["params"], local, rank)
        return out

    return reference, finish


def _misuse(par, model, zero: bool) -> list:
    """What report and train_step say to an optimizer built the ordinary MindSpore way
    (`nn.Adam(net.trainable_params())`), before any optimizer_parameters() call: None where accepted.
    Without ZeRO-1 train_step's check alone runs (an accepted train_step would train a step)."""
    wrong = nn.Adam(model.trainable_params(), learning_rate=1e-3)
    step = (lambda: par.train_step(wrong, *batches(1)[0])) if zero else (lambda: par.check_optimizer(wrong))
    messages = []
    for call in (lambda: par.report(wrong), step):
        try:
            call()
            messages.append(None)
        except ValueError as exc:
            messages.append(str(exc))
    return messages


def _errors(par, expected, local, rank):
    """Per parameter: (max abs difference, norm of the difference, norm of the expected shard).
    The attention key bias (its exact gradient is zero: softmax ignores a shift of all scores)
    is reported apart as "<name>[key]"."""
    errors = {}
    for row in par.table:
        if row.name not in local:
            continue
        region = row.layout.rank_slices(rank, row.global_shape)
        if expected[row.name][region].shape != local[row.name].shape:  # a ZeRO-1 gradient: the optimizer slice
            region = row.optimizer_layout.rank_slices(rank, row.global_shape)
        want = expected[row.name][region]
        diff = local[row.name] - want
        if row.name.endswith("qkv.bias"):  # features [heads, (q, k, v), head_dim] (examples/models.py)
            head_dim = row.global_shape[0] // 3 // HEADS
            within_head = np.arange(row.global_shape[0])[region] % (3 * head_dim)
            key = (within_head >= head_dim) & (within_head < 2 * head_dim)
            errors[row.name + "[key]"] = _error(diff[key], want[key])
            diff, want = diff[~key], want[~key]
        errors[row.name] = _error(diff, want)
    return errors


def _error(diff, want):
    if diff.size == 0:
        return [0.0, 0.0, 0.0]
    return [float(np.abs(diff).max()), float(np.linalg.norm(diff)), float(np.linalg.norm(want))]


def run_failing(fail_rank: int, out_dir: str) -> dict:
    ms.set_seed(1)
    model = GPT(vocab=128, hidden=64, heads=HEADS, layers=2, seq=16)
    from mindspore_hyper.runtime.distributed import world

    par = auto_parallelize(model, megatron(1, 2, False) if world().size == 2 else megatron(2, 2, False))
    rank = par.local_ranks[0]
    optimizer = nn.Adam(par.optimizer_parameters(), learning_rate=1e-3)
    data = batches(2)
    par.train_step(optimizer, *data[0])
    if rank == fail_rank:
        print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
        os._exit(0)  # no clean-up, no non-zero status for msrun to act on
    import time
    start = time.monotonic()
    try:
        par.train_step(optimizer, *data[1])
        outcome = {"error": None}
    except Exception as exc:  # the failure we wait for
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    outcome["seconds"] = time.monotonic() - start
    outcome["rank"] = rank
    with open(os.path.join(out_dir, f"fail_rank{rank}.json"), "w") as f:
        json.dump(outcome, f)
    sys.exit(3 if outcome["error"] else 0)


if __name__ == "__main__":
    run_cases_and_write_results(run_case)
