"""`mindspore-hyper tune`: the HyperOffload tuners (mindspore_hyper/offload/tuning.py) on a model."""
from __future__ import annotations

import argparse
import json
import sys

from mindspore_hyper.cli.arg_types import byte_size, int_list, is_terminal, nonnegative_int, positive_int, size_list
from mindspore_hyper.cli.common import add_command, add_model_arguments, check_model_arguments
from mindspore_hyper.cli.model_spec import GPT_PRESET, build_model, gpt_inputs, make_inputs

__all__ = ["add_parser", "run"]

TARGETS = ("prefetch-depth", "block-size")
DEFAULT_CANDIDATES = {"prefetch-depth": "2,4,8,16", "block-size": "32MiB,64MiB,128MiB,256MiB"}
EXAMPLES = """\
examples:
  mindspore-hyper tune prefetch-depth --device-memory 1MiB --block-size 64KiB --candidates 0,1,2,4
      (the GPT preset, blocks.* offloaded, real training steps per candidate)
  mindspore-hyper tune block-size --init-args '{"layers": 4}' --device-memory 2MB \\
      --candidates 32KiB,64KiB,128KiB --json
  mindspore-hyper tune prefetch-depth --model <your_module>:<YourCell> --inputs float32:32x512 float32:32x1 \\
      --offload-cells 'layers.*' --device-memory 8MiB --block-size 1MiB
  (a --model Class must return the scalar loss from its --inputs)"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `tune` subcommand."""
    p = add_command(subparsers, "tune", "HyperOffload tuners: prefetch depth or cache-block size",
                    "Run real offloaded training steps of a model for each candidate prefetch depth (blocks in "
                    "flight) or cache-block size and report the fastest, with stall time and prefetch hits/misses "
                    "per candidate.", EXAMPLES)
    p.add_argument("target", choices=TARGETS, help="what to tune")
    add_model_arguments(p, "'gpt' (examples/models.py GPT, the default) or package.module:Class returning the loss",
                        "model inputs as DTYPE:SHAPE[:HIGH] (gpt: token ids and labels of --batch x seq)")
    store = p.add_argument_group("store")
    store.add_argument("--offload-cells", dest="offload_cells", nargs="+", metavar="PATTERN",
                       help="Cells whose parameters live in the store (gpt default: blocks.*; else every direct "
                            "child with parameters)")
    store.add_argument("--device-memory", dest="device_memory", type=byte_size, metavar="SIZE",
                       help="device tier budget (default: the context flag)")
    store.add_argument("--host-memory", dest="host_memory", type=byte_size, metavar="SIZE",
                       help="host DRAM pool (default: the context flag)")
    store.add_argument("--block-size", dest="block_size", type=byte_size, metavar="SIZE",
                       help="prefetch-depth: the cache-block size (default: the context flag)")
    store.add_argument("--offload-dir", dest="offload_dir", metavar="DIR", help="disk tier directory")
    tuner = p.add_argument_group("tuner")
    tuner.add_argument("--candidates", metavar="LIST",
                       help=f"prefetch-depth: ints (default {DEFAULT_CANDIDATES['prefetch-depth']}); block-size: "
                            f"sizes (default {DEFAULT_CANDIDATES['block-size']})")
    tuner.add_argument("--steps", type=positive_int, default=3, help="measured steps per candidate (default 3)")
    tuner.add_argument("--warmup", type=nonnegative_int, default=1, help="unmeasured steps per candidate (default 1)")
    tuner.add_argument("--optimizer", choices=("adam", "sgd"), default="adam", help="optimizer (host update rule)")
    tuner.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr (drawn only when stderr is a terminal)")
    tuner.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run, parser=p)
    return p


def _candidates(args: argparse.Namespace) -> list:
    text = args.candidates or DEFAULT_CANDIDATES[args.target]
    parse = int_list if args.target == "prefetch-depth" else size_list
    try:
        return parse(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"--candidates {text!r} for {args.target}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Build the offloaded model, run the tuner, print the table (or JSON)."""
    if args.block_size is not None and args.target == "block-size":
        raise ValueError("--block-size sets the block of the prefetch-depth tuner; block-size tunes it: use --candidates")
    check_model_arguments(args, "float32:32x512 float32:32x1")
    candidates = _candidates(args)
    import mindspore as ms
    from mindspore import nn

    from mindspore_hyper.offload import OffloadPolicy, OffloadStore, hyper_offload, tune_block_size, tune_prefetch_depth

    ms.set_context(mode=ms.PYNATIVE_MODE)
    inputs = make_inputs(args.inputs or gpt_inputs(args.init_args, args.batch))
    cells = args.offload_cells or (["blocks.*"] if args.model == GPT_PRESET else None)
    optimizer = (lambda ps: nn.Adam(ps, learning_rate=1e-3)) if args.optimizer == "adam" else \
        (lambda ps: nn.SGD(ps, learning_rate=1e-3))
    store_args = {k: getattr(args, k) for k in ("device_memory", "host_memory", "offload_dir")}

    def build(block_size):
        ms.set_seed(0)
        model = build_model(args.model, args.init_args)
        store = OffloadStore(block_size=block_size, **store_args)
        offloaded = hyper_offload(model, OffloadPolicy(cells=cells), optimizer=optimizer, store=store)
        step = offloaded.train_step(lambda *xs: model(*xs))
        return (lambda: step(*inputs)), store

    common = {"steps": args.steps, "warmup": args.warmup, "progress": args.progress and is_terminal(sys.stderr)}
    if args.target == "prefetch-depth":
        run_step, store = build(args.block_size)
        try:
            result = tune_prefetch_depth(run_step, store, candidates=candidates, **common)
        finally:
            store.close()
    else:
        result = tune_block_size(build, candidates=candidates, **common)
    if args.json:
        print(json.dumps({"target": args.target, "best": result.best,
                          "measurements": {str(k): v for k, v in result.measurements.items()}}, indent=2))
        return 0
    print(f"tune {args.target}: best {result.best}")
    print(result.table())
    return 0
