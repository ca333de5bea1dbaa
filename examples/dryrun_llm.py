"""A GPT-style LLM's training step, laid out data x tensor parallel (Megatron's column/row split):
the script the dry run measures at cluster scale and the simulation runs at laptop scale.

    mindspore-hyper dryrun --devices 128 --hardware ascend-910c examples/dryrun_llm.py \\
        --layers 64 --hidden 5120 --heads 40 --seq 4096 --data 16 --tensor 8   # ~20B, 128 devices
    mindspore-hyper run --devices 4 examples/dryrun_llm.py --data 2 --tensor 2  # tiny, values computed

The model is built under MindSpore's `no_init_parameters()`: in the dry run no weight is ever
allocated; in simulation each Parameter is initialised when first used.
"""
import argparse
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn
from mindspore.nn.utils import no_init_parameters

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore_hyper as mh  # noqa: E402
from models import GPT, PipelinedGPT  # noqa: E402


def megatron(data: int, tensor: int, zero: bool, pipeline: int = 1):
    """Column-split qkv/fc1, row-split proj/fc2, vocabulary-split embedding and head; with
    `pipeline` > 1 a "pipeline" axis too (the blocks cut into that many stages)."""
    mesh = mh.Layout((data, pipeline, tensor), ("data", "pipeline", "tensor")) if pipeline > 1 else \
        mh.Layout((data, tensor), ("data", "tensor"))
    strategy = mesh(tensor_map=(), optimizer_state="data" if zero else None)
    strategy.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    strategy.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    return strategy.override("embed.*", "tensor").override("head.weight", "tensor")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--data", type=int, default=2)
    p.add_argument("--tensor", type=int, default=2)
    p.add_argument("--pipeline", type=int, default=1, help="pipeline stages (1F1B)")
    p.add_argument("--microbatches", type=int, default=4, help="microbatches per step with --pipeline")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per data-parallel rank (per microbatch)")
    p.add_argument("--no-zero", action="store_true", help="keep full optimizer states on every data rank")
    args = p.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    with no_init_parameters():
        net = (PipelinedGPT if args.pipeline > 1 else GPT)(args.vocab, args.hidden, args.heads, args.layers, args.seq)
        strategy = megatron(args.data, args.tensor, not args.no_zero, args.pipeline)
        if args.pipeline > 1:
            model = mh.auto_parallelize(net, strategy, pipeline={"schedule": "1f1b", "microbatches": args.microbatches})
        else:
            model = mh.auto_parallelize(net, strategy)
        optimizer = nn.AdamWeightDecay(model.optimizer_parameters(), 1e-4)
    batch = args.data * args.micro_batch * (args.microbatches if args.pipeline > 1 else 1)
    ids = Tensor(np.random.default_rng(0).integers(0, args.vocab, (batch, args.seq)).astype(np.int32))
    model.train_step(optimizer, ids, ids)


if __name__ == "__main__":
    main()
