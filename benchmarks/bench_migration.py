"""PyTorch -> MindSpore migration: conversion time, and the converted Cell's forward time against
the torch original and (MLP, TransformerBlock) a hand-written MindSpore Cell, all in this run.

    python benchmarks/bench_migration.py              # all parts
    python benchmarks/bench_migration.py --part forward --repeat 5 --models mlp,gpt2
    python benchmarks/bench_migration.py --part depth  # structure="modules": 2 vs 24 layers
    python benchmarks/bench_migration.py --part gpt    # converted GPT-2 vs examples/models.py GPT
    python benchmarks/bench_migration.py --sweep [--families named|all|fast|llama,bert] [--write-docs]
    python benchmarks/bench_migration.py --sweep --parallel-only --jsonl ROWS --out MERGED [--families ...]

sweep (tests/migrate/migrate_sweep.py): every transformers family with a causal-LM, masked-LM, seq2seq or
image/audio classification head (--families all; `named`, the default, is the issue's list) built from a
scaled-down config (2 layers, hidden 32, use_cache=False, dropout 0, random weights), converted with the
default convert (the port) at (2, 8), checked at (3, 11) against torch (<= 1e-4) and trained 5 AdamW steps
beside torch.optim.AdamW (losses and parameters <= 1e-4); one row per family with the first failing op or
module and its reason, the pass rate over the families that built, and the wall time. --write-docs puts
the table into docs/migration.md (between the sweep markers); --jsonl appends each row as it finishes.
Each passing row then runs the parallel checks (migrate_sweep.parallel_checks): one step on a 2 x 2 data x tensor
mesh in simulation with the splits of tensor_parallel_plan, and pipeline 2 over the layer list for causal LMs.
--parallel-only converts the families whose last row in --jsonl passed and runs only those checks (no torch
training, no float64 reference), appending every row of --jsonl, with the parallel fields merged into the passing
ones, to --out as it finishes (rows already in --out are kept, so an interrupted pass resumes); the table is then
regenerated from --out with --jsonl MERGED --resume --write-docs.

depth: `convert(..., structure="modules", check=False)` of the 2- and 24-layer variants of GPT-2,
Llama (GQA + RoPE) and BERT (hidden 32): conversion seconds and generated source lines, and the
24/2 lines ratio (goal <= 1.2).

gpt: GPT-2 (n_embd 64, 4 heads, 2 layers, vocab 128, exact GELU) converted with structure="modules"
against examples/models.py GPT of the same sizes, written by hand: median eval forward (logits) and
training step (value_and_grad of a next-token loss, then an SGD update) over --repeat rounds,
interleaved; the ratios converted/hand (goal <= 1.1).

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


def llama(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                        max_position_embeddings=64, use_cache=False))


def bert_layers(layers: int):
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                                intermediate_size=64, vocab_size=101, max_position_embeddings=32))


def depth_part() -> None:
    builders = {"gpt2": lambda n: gpt2(n_layer=n), "llama": llama, "bert": bert_layers}
    print(f"{'model':<6} {'convert s (2)':>13} {'convert s (24)':>14} {'lines (2)':>9} {'lines (24)':>10} "
          f"{'lines 24/2':>10} {'classes':>7}")
    for name, build in builders.items():
        row = []
        for layers in (2, 24):
            torch.manual_seed(0)
            model = build(layers).eval()
            start = time.perf_counter()
            _, report = convert(model, torch.randint(0, 101, (2, 16)), structure="modules", check=False)
            row.append((time.perf_counter() - start, report.source_lines, len(report.classes)))
        (t2, l2, c2), (t24, l24, c24) = row
        print(f"{name:<6} {t2:13.2f} {t24:14.2f} {l2:9d} {l24:10d} {l24 / l2:10.2f} {c2:>3}/{c24:<3}")


def gpt_part(repeat: int, batch: int) -> None:
    from mindspore import mint, nn, ops

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from models import GPT  # noqa: E402

    torch.manual_seed(0)
    model = gpt2(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=16, activation_function="gelu",
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).eval()
    ids_t = torch.randint(0, 128, (batch, 16))
    converted, _ = convert(model, ids_t, structure="modules", check=False)
    hand = GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)
    ids = to_mindspore(ids_t)
    labels = to_mindspore(torch.roll(ids_t, -1, 1))

    def loss_of(logits):
        b, t, v = logits.shape
        return ops.cross_entropy(mint.reshape(logits, (b * t, v)), mint.reshape(labels, (b * t,)))

    def train_step(cell):
        optimizer = nn.SGD(cell.trainable_params(), 1e-3)
        grad = ms.value_and_grad(lambda x: loss_of(cell(x)), None, optimizer.parameters)

        def step():
            loss, grads = grad(ids)
            optimizer(grads)
            return loss.asnumpy()
        return step

    fwd_conv, fwd_hand, step_conv, step_hand = interleaved_medians(
        [lambda: converted(ids).asnumpy(), lambda: hand(ids).asnumpy(), train_step(converted), train_step(hand)],
        repeat)
    print(f"GPT (batch {batch}, seq 16): forward converted {fwd_conv * 1e3:.2f} ms, hand-written "
          f"{fwd_hand * 1e3:.2f} ms, ratio {fwd_conv / fwd_hand:.2f} (goal <= 1.1); train step converted "
          f"{step_conv * 1e3:.2f} ms, hand-written {step_hand * 1e3:.2f} ms, ratio {step_conv / step_hand:.2f} "
          f"(goal <= 1.1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "forward", "depth", "gpt"), default="all")
    parser.add_argument("--repeat", type=int, default=20, help="timed forwards per model (median reported)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", default="mlp,transformer_block,resnet,gpt2,bert")
    parser.add_argument("--sweep", action="store_true", help="run the transformers family sweep (only)")
    parser.add_argument("--families", default=None,
                        help="named (the issue's list, the default), all, fast, or a comma list; with "
                             "--parallel-only a filter on the rows of --jsonl (default: all of them)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per family before it counts as failed")
    parser.add_argument("--write-docs", action="store_true", help="write the sweep table into docs/migration.md")
    parser.add_argument("--jsonl", help="append each sweep row to this file as it finishes")
    parser.add_argument("--resume", action="store_true",
                        help="with --jsonl: keep the rows already in that file (the last per family) instead of "
                             "running those families again, except the ones --rerun names")
    parser.add_argument("--rerun", default="", help="with --resume: 'failed' (rows that failed) or a comma list")
    parser.add_argument("--parallel-only", action="store_true",
                        help="with --sweep --jsonl ROWS --out FILE: only the parallel checks of ROWS' passing rows")
    parser.add_argument("--out", help="with --parallel-only: the JSONL the merged rows are appended to")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    print(f"load {os.getloadavg()}")
    if args.parallel_only or args.out:
        if not (args.sweep and args.parallel_only and args.jsonl and args.out):
            raise SystemExit("--parallel-only needs --sweep, --jsonl (the rows to check) and --out (the merged rows); "
                             "--out is used only with --parallel-only")
        if args.resume or args.rerun or args.write_docs:
            raise SystemExit("--parallel-only writes --out only: run --resume/--rerun/--write-docs on --out afterwards")
        parallel_part(args)
        return
    if args.sweep:
        sweep_part(args)
        return
    if args.part in ("all", "depth"):
        depth_part()
    if args.part in ("all", "gpt"):
        gpt_part(args.repeat, args.batch)
    if args.part in ("all", "forward"):
        forward_part(args)


DOC = os.path.join(ROOT, "docs", "migration.md")
BEGIN, END = "<!-- sweep table: begin (benchmarks/bench_migration.py --sweep --write-docs) -->", "<!-- sweep table: end -->"


def sweep_part(args: argparse.Namespace) -> None:
    import dataclasses
    import json
    import warnings

    import migrate_sweep as sweep

    warnings.filterwarnings("ignore")
    args.families = args.families or "named"
    if args.families == "named":
        families = list(sweep.NAMED)
    elif args.families == "fast":
        families = list(sweep.FAST)
    elif args.families == "all":
        named = dict(sweep.NAMED)
        families = [(f, h) for f, h in sweep.all_families() if f not in named] + list(sweep.NAMED)
        families.sort()
    else:
        named = dict(sweep.NAMED)
        families = [(f, named.get(f) or dict(sweep.all_families())[f]) for f in args.families.split(",")]
    kept = _kept_rows(args, sweep.SweepRow) if args.resume else {}
    start = time.perf_counter()
    rows = []
    for family, head in families:
        if (family, head) in kept:
            rows.append(kept[(family, head)])
            continue
        row = sweep.sweep_one(family, head, limit=args.limit)
        rows.append(row)
        print(f"{row.family:<16} {row.head:<20} {row.status:<9} {row.stage:<8} {row.seconds:6.1f} s  {row.reason}",
              flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(dataclasses.asdict(row)) + "\n")
    wall = time.perf_counter() - start
    passed, built = sweep.pass_rate(rows)
    reused = sum((r.family, r.head) in kept for r in rows)
    timing = (f"wall time {wall:.0f} s ({len(rows)} families, load {os.getloadavg()[0]:.1f} at the end)" if not reused
              else f"{len(rows) - reused} families run now in {wall:.0f} s and {reused} rows kept from earlier runs "
                   f"of {os.path.basename(args.jsonl)}; the families' own times add up to {sum(r.seconds for r in rows):.0f} s (load "
                   f"{os.getloadavg()[0]:.1f} at the end)")
    summary = (f"{passed} of {built} families that build offline pass ({100.0 * passed / max(built, 1):.1f}%); "
               f"{len(rows) - built} did not build; {timing}")
    checked = [r for r in rows if r.parallel_error is not None or r.parallel_reason]
    if checked:
        ok = [r for r in checked if r.parallel_error is not None and r.parallel_error <= sweep.TOL]
        sources = [r.parallel_source or "hand-written patterns" for r in ok]  # "": a row from before the plan
        by_source = {s: sources.count(s) for s in dict.fromkeys(sources)}
        decoders = [r for r in checked if r.head in sweep.PIPELINE_HEADS]
        piped = [r for r in decoders if r.pipeline_error is not None and not r.parallel_reason]
        summary += (f"; parallel as converted (last column): the 2 x 2 step passes for {len(ok)} of the {len(checked)} "
                    f"passing rows checked (" + ", ".join(f"{n} {s}" for s, n in by_source.items()) + "), "
                    f"pipeline 2 for {len(piped)} of their {len(decoders)} {'/'.join(sweep.PIPELINE_HEADS)} rows")
    print(summary)
    text = sweep.table(rows)
    print(text)
    if args.write_docs:
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
        if BEGIN not in doc or END not in doc:
            raise SystemExit(f"{DOC} has no sweep markers ({BEGIN!r} ... {END!r})")
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        label = f"`{args.families}`" if len(args.families) < 60 else f"{len(families)} listed"
        block = f"{BEGIN}\nFamilies: {label}. {summary}.\n\n{text}\n{END}"
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(head + block + tail)


def parallel_part(args: argparse.Namespace) -> None:
    """--parallel-only: the parallel checks of the passing rows of --jsonl, every row appended to --out."""
    import dataclasses
    import json
    import warnings

    import migrate_sweep as sweep

    warnings.filterwarnings("ignore")
    if not os.path.exists(args.jsonl):
        raise SystemExit(f"--jsonl {args.jsonl}: no such file")
    rows = _kept_rows(argparse.Namespace(jsonl=args.jsonl, rerun=""), sweep.SweepRow)
    if args.families:
        wanted = {"named": dict(sweep.NAMED), "fast": dict(sweep.FAST)}.get(args.families) or \
            ({f: None for f, _ in rows} if args.families == "all" else {f: None for f in args.families.split(",")})
        unknown = [f for f in wanted if f not in {f for f, _ in rows}]
        if unknown:
            raise SystemExit(f"--families: {unknown} have no row in {args.jsonl}")
        rows = {k: r for k, r in rows.items() if k[0] in wanted}
    done = _kept_rows(argparse.Namespace(jsonl=args.out, rerun=""), sweep.SweepRow)
    start, counts = time.perf_counter(), {"pass": 0, "fail": 0}
    for key, row in sorted(rows.items()):
        if key in done:
            continue
        if row.status == "pass":
            row = sweep.parallel_only(row, limit=args.limit)
            counts["fail" if row.parallel_reason else "pass"] += 1
            print(f"{row.family:<16} {row.head:<20} {row.status:<5} {row.stage:<8} {row.parallel_source:<22} "
                  f"{row.parallel_error if row.parallel_error is None else f'{row.parallel_error:.1e}'} "
                  f"{row.pipeline_error if row.pipeline_error is None else f'{row.pipeline_error:.1e}'} "
                  f"{row.parallel_reason}", flush=True)
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(dataclasses.asdict(row)) + "\n")
    print(f"parallel checks: {counts['pass']} passed, {counts['fail']} failed of the passing rows run now "
          f"({len(done)} rows already in {args.out}); {time.perf_counter() - start:.0f} s")


def _kept_rows(args: argparse.Namespace, row_type) -> dict:
    """(family, head) -> the last row of each family in --jsonl, less the ones --rerun names."""
    import json

    if not args.jsonl:
        raise SystemExit("--resume needs --jsonl (the file of earlier rows)")
    kept = {}
    if os.path.exists(args.jsonl):
        with open(args.jsonl, encoding="utf-8") as f:
            for line in f:
                row = row_type(**json.loads(line))
                kept[(row.family, row.head)] = row
    again = set(args.rerun.split(",")) if args.rerun not in ("", "failed") else set()
    return {k: r for k, r in kept.items() if k[0] not in again and not (args.rerun == "failed" and r.status == "fail")}


def forward_part(args: argparse.Namespace) -> None:
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
