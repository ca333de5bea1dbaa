"""The msrun test workers' entry: the cases named on the command line run in distributed mode,
each case's single-device reference is trained once, and every rank writes its results to JSON."""
import json
import os
import pickle
import sys
import time


def run_cases_and_write_results(run_case):
    """Run each case named on the command line (after the output folder) in distributed mode and
    write this rank's results to <folder>/rank<r>.json.

    `run_case(case)` runs the distributed part and returns (reference, finish): reference()
    trains the single-device model and returns its figures, finish(figures) this rank's results;
    reference None for a case without one (finish(None)). Case i's reference is trained once, by
    rank i mod size, after every case's distributed run (so no rank computes it while its peers
    wait in a collective, and the job does it once instead of once per rank), and read by every
    rank from <folder>/reference<i>.pkl."""
    import mindspore_hyper as mh
    from mindspore_hyper.runtime.distributed import world

    out_dir, cases = sys.argv[1], sys.argv[2:]
    mh.set_context(mode="distributed", comm_timeout=float(os.environ.get("TEST_COMM_TIMEOUT", "60")))
    runs = [run_case(case) for case in cases]
    rank, size = world().rank, world().size
    paths = [os.path.join(out_dir, f"reference{i}.pkl") for i in range(len(cases))]
    for i, (reference, _) in enumerate(runs):
        if reference is not None and i % size == rank:
            with open(paths[i] + ".part", "wb") as f:
                pickle.dump(reference(), f)
            os.replace(paths[i] + ".part", paths[i])
    deadline = time.monotonic() + 600
    results = {}
    for case, path, (reference, finish) in zip(cases, paths, runs):
        if reference is None:
            results[case] = finish(None)
            continue
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank}: the single-device reference of case {case!r} ({path}) did not appear")
            time.sleep(0.05)
        with open(path, "rb") as f:
            results[case] = finish(pickle.load(f))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def train_reference(model, optimizer, data) -> dict:
    """One device, one optimizer step per batch: {"losses", "grads" (of the first step),
    "params" (after the last)}, by parameter name, as numpy arrays."""
    import mindspore as ms

    step = ms.value_and_grad(model, None, optimizer.parameters)
    names = [n for n, p in model.parameters_and_names() if p.requires_grad]
    figures = {"losses": []}
    for i, batch in enumerate(data):
        loss, grads = step(*batch)
        if i == 0:
            figures["grads"] = dict(zip(names, [g.asnumpy() for g in grads]))
        optimizer(grads)
        figures["losses"].append(float(loss.asnumpy()))
    figures["params"] = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    return figures
