"""Worker of the multimodal msrun tests: runs the encoder pipeline in distributed mode (encoders on
ranks 0..N-2, the LM on the last rank) and writes what this rank got to OUT_DIR/<run>/rank<r>.npz.

Usage (under msrun): mm_worker.py OUT_DIR RUN [RUN ...], a RUN being infer|train|fail:AHEAD, run
one after another in the same processes (a launch costs every process's MindSpore start-up).
("fail": encoder 0 raises while encoding its second batch, prints the error and leaves with
status 0 without closing anything, as a crashed process would: msrun kills every worker as soon as
one exits non-zero, which would race the LM's own report; so the LM must notice the dead peer by
itself, and its failure is the job's.)
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
from mindspore import nn  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.multimodal import AsyncEncoderPipeline, FeatureCache, signature_dim  # noqa: E402
from mm_models import loss_fn, make_batches, make_models  # noqa: E402

STEPS = 2


def main(out_dir, what, ahead):
    out_dir = os.path.join(out_dir, what)
    os.makedirs(out_dir, exist_ok=True)
    mh.set_context(mode="distributed")
    rank = int(os.environ["RANK_ID"])
    workers = int(os.environ["MS_WORKER_NUM"])
    encoder, lm = make_models(seed=3)
    out = {}
    if what == "fail":
        calls = []

        def failing(*args):
            calls.append(1)
            if rank == 0 and len(calls) == 2:
                raise RuntimeError("encoder failure injected by the test")
        encoder.register_forward_pre_hook(lambda cell, inputs: failing())
        pipe = AsyncEncoderPipeline(encoder, lm, ahead=ahead, num_encoders=workers - 1)
        pipe.infer(make_batches(6, seed=1, labels=False))
        return
    if what == "infer":
        batches = make_batches(6, seed=1, labels=False, duplicates_of={4: 0})
        cache = FeatureCache(signature_dim(16), threshold=0.98)
        pipe = AsyncEncoderPipeline(encoder, lm, ahead=ahead, num_encoders=workers - 1, cache=cache)
        result = pipe.infer(batches)
        for rid, row in result.outputs.items():
            out[f"out{rid}"] = row
        meta = {"role": pipe.role, "reused": {str(k): v for k, v in result.reused_from.items()},
                "stats": result.cache_stats, "consume": result.timeline.consume_order(),
                "events": [(e.lane, e.kind, e.args["batch"], e.start, e.end) for e in result.timeline.spans]}
    else:
        batches = make_batches(5, seed=1)
        pipe = AsyncEncoderPipeline(encoder, lm, ahead=ahead, num_encoders=workers - 1)
        opt = nn.SGD(pipe.local_parameters(), learning_rate=0.1)
        losses = []
        for step in range(STEPS):
            result = pipe.train_step(batches, loss_fn)
            if step == 0:
                for p, g in zip(pipe.local_parameters(), result.grads):
                    out["grad:" + p.name] = g.asnumpy()
            losses.append(result.losses)
            opt(result.grads)
        for p in pipe.local_parameters():
            out["param:" + p.name] = p.asnumpy()
        meta = {"role": pipe.role, "losses": [{str(k): v for k, v in l.items()} for l in losses],
                "events": [(e.lane, e.kind, e.args["batch"], e.start, e.end) for e in result.timeline.spans]}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **out)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    try:
        for run in sys.argv[2:]:
            what, _, ahead = run.partition(":")
            main(sys.argv[1], what, int(ahead))
    except RuntimeError as exc:
        if "encoder failure injected by the test" not in str(exc):
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(0)
