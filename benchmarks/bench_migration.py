"""PyTorch -> MindSpore migration: conversion time, and the converted Cell's forward time against
the torch original and (MLP, TransformerBlock) a hand-written MindSpore Cell, all in this run.

    python benchmarks/bench_migration.py              # MLP, TransformerBlock, ResNet, GPT-2, BERT
    python benchmarks/bench_migration.py --repeat 5 --models mlp,gpt2

Conversion time is the wall time of `convert(model, inputs, check=False)` (trace, map, generate,
build, load weights). Forward times are medians of --repeat eval-mode forwards after one warm-up,
interleaved (torch, converted, hand-written, torch, ...) so that load from other processes hits
all alike (torch under no_grad; MindSpore in PyNative mode, outputs synchronised with asnumpy()).
The hand-written Cells get the same weights through convert_state_dict.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import mindspore as ms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "migrate"))
from migrate_models import (  # noqa: E402  (the test models and their hand-written twins)
    MsMLP, MsTransformerBlock, TorchMLP, TorchTransformerBlock, bert, gpt2, resnet)
from mindspore_hyper.migrate import convert, convert_state_dict  # noqa: E402
from mindspore_hyper.migrate.compare import cell_outputs, relative_error, to_mindspore, torch_outputs  # noqa: E402


def models(batch: int):
    """name -> (torch model, example inputs, hand-written Cell class or None)."""
    return {
        "mlp": (TorchMLP(512, 2048, 512), (torch.randn(batch * 16, 512),), lambda: MsMLP(512, 2048, 512)),
        "transformer_block": (TorchTransformerBlock(256, 8, 1024), (torch.randn(batch, 64, 256),),
                              lambda: MsTransformerBlock(256, 8, 1024)),
        "resnet": (resnet(), (torch.randn(batch, 3, 64, 64),), None),
        "gpt2": (gpt2(n_embd=128, n_layer=2, n_head=4, n_positions=128), (torch.randint(0, 101, (batch, 64)),), None),
        "bert": (bert(), (torch.randint(0, 101, (batch, 32)), torch.ones(batch, 32, dtype=torch.int64)), None),
    }


def interleaved_medians(fns, repeat: int):
    """Median seconds of each function, timed in rounds (one call of each per round) after a warm-up."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed forwards per model (median reported)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", default="mlp,transformer_block,resnet,gpt2,bert")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    table = models(args.batch)
    print(f"torch threads {torch.get_num_threads()}, repeat {args.repeat}, batch {args.batch}")
    print(f"{'model':<18} {'tracer':<13} {'convert s':>9} {'torch ms':>9} {'converted ms':>12} {'hand ms':>8} "
          f"{'conv/torch':>10} {'conv/hand':>9} {'max rel err':>11}")
    for name in args.models.split(","):
        model, inputs, hand = table[name]
        model.eval()
        start = time.perf_counter()
        cell, report = convert(model, inputs, check=False)
        convert_s = time.perf_counter() - start
        ms_inputs = [to_mindspore(x) for x in inputs]
        with torch.no_grad():
            want = torch_outputs(model(*inputs))
        error = relative_error(cell_outputs(cell(*ms_inputs)), want)

        def torch_forward():
            with torch.no_grad():
                model(*inputs)

        fns = [torch_forward, lambda: cell_outputs(cell(*ms_inputs))]
        if hand is not None:
            hand_cell = hand()
            convert_state_dict(model, hand_cell)
            assert relative_error(cell_outputs(hand_cell(*ms_inputs)), want) <= 1e-5
            fns.append(lambda: hand_cell(*ms_inputs).asnumpy())
        torch_s, cell_s, *rest = interleaved_medians(fns, args.repeat)
        hand_s = rest[0] if rest else None
        hand_text = f"{hand_s * 1e3:8.2f}" if hand_s else f"{'-':>8}"
        ratio_hand = f"{cell_s / hand_s:9.2f}" if hand_s else f"{'-':>9}"
        print(f"{name:<18} {report.tracer:<13} {convert_s:9.2f} {torch_s * 1e3:9.2f} {cell_s * 1e3:12.2f} "
              f"{hand_text} {cell_s / torch_s:10.2f} {ratio_hand} {error:11.1e}")


if __name__ == "__main__":
    main()
