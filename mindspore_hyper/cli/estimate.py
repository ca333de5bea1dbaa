"""`mindspore-hyper estimate`: memory per device of a transformer job (mindspore_hyper.estimate)."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict

from mindspore_hyper.cli.arg_types import byte_size, nonnegative_int, positive_int, size_list
from mindspore_hyper.cli.common import add_command
from mindspore_hyper.estimate import (ACTIVATION_MODELS, CONTEXT_METHODS, DEFAULT_SEQ_LENS, PRESETS, RECOMPUTE_MODES,
                                      SCHEDULES, TIERS, build_config, build_strategy, estimate_job,
                                      estimate_step_time, format_bytes, hardware_presets, largest_fitting,
                                      plot_sweep, read_job_file, sequence_sweep)
from mindspore_hyper.estimate.transformer_config import ELEMENT_BYTES, NORMS

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  mindspore-hyper estimate --preset llama2-7b --data 8 --tensor 4 --zero 1 --recompute selective \\
      --device-memory 64GiB
  mindspore-hyper estimate --layers 32 --hidden 4096 --heads 32 --vocab 32000 --seq-len 4096 \\
      --micro-batch 2 --inference --sweep 4K:128K --plot kv_sweep.png
  mindspore-hyper estimate --config job.yaml --pipeline 4 --in-flight 2 --json
  mindspore-hyper estimate --preset gpt3-175b --tensor 8 --pipeline 8 --microbatches 64 \
      --sequence-parallel --recompute selective --hardware a100-80gb      (step time, MFU)
  mindspore-hyper estimate --preset llama2-7b --tensor 8 --context 4 --recompute selective \
      --device-memory 64GiB --sweep 4K:128K         (which lengths fit with and without cp)
  (job.yaml: `model:` and `strategy:` sections with the fields below, optional `device_memory:`;
   flags override the file, the file overrides --preset)"""

# (flag, field, type, help) of TransformerConfig
MODEL_FLAGS = (
    ("--layers", "layers", positive_int, "transformer layers"),
    ("--hidden", "hidden", positive_int, "hidden size h"),
    ("--heads", "heads", positive_int, "attention heads a"),
    ("--vocab", "vocab", positive_int, "vocabulary size"),
    ("--seq-len", "seq_len", positive_int, "sequence length s in tokens"),
    ("--micro-batch", "micro_batch", positive_int, "sequences per micro-batch on one data-parallel rank"),
    ("--ffn", "ffn", positive_int, "MLP width (default 4 x hidden)"),
    ("--kv-heads", "kv_heads", positive_int, "key/value heads for grouped-query attention (default: heads)"),
    ("--experts", "experts", nonnegative_int, "MoE experts per layer (0 = dense)"),
)
MODEL_BOOLS = (
    ("bias", "linear layers have biases"),
    ("gated-mlp", "gated (SwiGLU) MLP: gate, up and down projections"),
    ("learned-positions", "a learned position table of seq-len rows"),
    ("tied-embeddings", "the LM head reuses the embedding table"),
)
# (flag, field, type, help) of JobStrategy
STRATEGY_FLAGS = (
    ("--data", "data", positive_int, "data-parallel size"),
    ("--tensor", "tensor", positive_int, "tensor-parallel size (Megatron column/row parallel)"),
    ("--pipeline", "pipeline", positive_int, "pipeline stages"),
    ("--expert", "expert", positive_int, "expert-parallel size (divides --data)"),
    ("--microbatches", "microbatches", positive_int, "micro-batches per step (default: --pipeline)"),
    ("--in-flight", "in_flight", positive_int,
     "micro-batches whose activations a stage holds (default 1F1B: min(pipeline - stage, microbatches))"),
    ("--optimizer-states", "optimizer_states", nonnegative_int, "fp32 optimizer states per parameter (Adam: 2)"),
    ("--context", "context_parallel", positive_int,
     "context-parallel size: each sequence split into N chunks (activations and KV cache / N)"),
    ("--chunks", "chunks", positive_int, "model chunks per pipeline rank (interleaved_1f1b >= 2; zb_v, dualpipe_v 2)"),
)
STRATEGY_BOOLS = (
    ("sequence-parallel", "Megatron sequence parallelism over the tensor-parallel group"),
    ("master-weights", "fp32 master copy of 16-bit parameters (default: when --dtype-bytes < 4)"),
    ("inference", "forward only with a KV cache (no gradients or optimizer states)"),
    ("grad-sync-overlap", "step time (--hardware) only: the data-parallel gradient sync overlaps the backward "
                          "(default; --no-grad-sync-overlap: one sync after the backward, Megatron-LM's local DDP)"),
)
STEP_TIME_ONLY = ("grad_sync_overlap",)  # strategy fields only the step time reads: refused without --hardware


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `estimate` subcommand."""
    p = add_command(subparsers, "estimate", "memory per device of a transformer job",
                    "Estimate per-device memory of a transformer job: parameters, gradients, optimizer states, "
                    "activations (Korthikanti et al. 2022, Table 2) and KV cache, per pipeline stage; what fits a "
                    "device; a sequence sweep.", EXAMPLES)
    source = p.add_argument_group("model")
    source.add_argument("--preset", choices=sorted(PRESETS), help="start from a named model")
    source.add_argument("--config", metavar="FILE", help="a job YAML (model:, strategy:, device_memory:)")
    for flag, field, kind, text in MODEL_FLAGS:
        source.add_argument(flag, dest=field, type=kind, metavar="N", help=text)
    source.add_argument("--dtype-bytes", dest="dtype_bytes", type=int, choices=ELEMENT_BYTES,
                        help="element size of parameters and gradients (2 = bf16/fp16)")
    source.add_argument("--norm", choices=NORMS, help="layernorm (gamma, beta) or rmsnorm (gamma)")
    for name, text in MODEL_BOOLS:
        source.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                            help=text)
    strategy = p.add_argument_group("strategy")
    for flag, field, kind, text in STRATEGY_FLAGS:
        strategy.add_argument(flag, dest=field, type=kind, metavar="N", help=text)
    strategy.add_argument("--zero", dest="zero_stage", type=int, choices=(0, 1, 2, 3),
                          help="ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters sharded over --data")
    strategy.add_argument("--recompute", choices=RECOMPUTE_MODES, help="activation recomputation")
    strategy.add_argument("--offload-params", dest="offload_params", choices=TIERS, help="tier of the parameters")
    strategy.add_argument("--offload-optimizer", dest="offload_optimizer", choices=TIERS,
                          help="tier of the optimizer states")
    strategy.add_argument("--context-method", dest="context_method", choices=CONTEXT_METHODS,
                          help="context parallelism: ring (K/V blocks around the group), ulysses (AllToAll) or "
                               "all_gather (the whole K/V gathered, Llama 3's; step time only)")
    strategy.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    strategy.add_argument("--activation-model", dest="activation_model", choices=ACTIVATION_MODELS,
                          help="megatron: Table 2 (default); simulation: what the CPU simulation counts for "
                               "examples/models.py's GPT")
    for name, text in STRATEGY_BOOLS:
        strategy.add_argument(f"--{name}", dest=name.replace("-", "_"), action=argparse.BooleanOptionalAction,
                              help=text)
    out = p.add_argument_group("output")
    out.add_argument("--device-memory", dest="device_memory", type=byte_size, metavar="SIZE",
                     help="per-device budget, e.g. 64GiB (64GB: 10^9 bytes): says whether it fits, the largest micro-batch and the "
                          "longest sequence that fit")
    out.add_argument("--sweep", nargs="?", const=list(DEFAULT_SEQ_LENS), type=size_list, metavar="LENGTHS",
                     help="estimate at these sequence lengths (default 4K:128K, doubling; or e.g. 4K,32K,128K)")
    out.add_argument("--plot", metavar="PNG", help="with --sweep: save the sweep as a PNG")
    out.add_argument("--hardware", metavar="NAME",
                     help=f"also predict the training step's time and MFU on this hardware (a preset: "
                          f"{', '.join(hardware_presets())}; or a .yaml file, docs/estimate.md)")
    out.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run, parser=p)
    return p


_FLAG_NAMES = {"zero_stage": "--zero", "context_parallel": "--context"}


def _flag_of(field: str) -> str:
    return _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def _given(args: argparse.Namespace, fields) -> Dict[str, Any]:
    return {f: getattr(args, f) for f in fields if getattr(args, f) is not None}


def _flag_message(exc: ValueError, fields) -> str:
    """The library names fields (`tensor=3: ...`); the CLI user typed flags (`--tensor 3: ...`)."""
    text = str(exc)
    for field in fields:
        if text.startswith(f"{field}="):
            return f"{_flag_of(field)} {text[len(field) + 1:]}"
    return text


def run(args: argparse.Namespace) -> int:
    """Build config and strategy from --config, --preset and flags; print the estimate."""
    model_fields = [f for _, f, _, _ in MODEL_FLAGS] + ["dtype_bytes", "norm"] + \
        [n.replace("-", "_") for n, _ in MODEL_BOOLS]
    strategy_fields = [f for _, f, _, _ in STRATEGY_FLAGS] + ["zero_stage", "recompute", "offload_params",
                                                             "offload_optimizer", "activation_model",
                                                             "context_method", "schedule"] + \
        [n.replace("-", "_") for n, _ in STRATEGY_BOOLS]
    spec = read_job_file(args.config) if args.config else {"model": {}, "strategy": {}, "device_memory": None}
    model = {**spec["model"], **({"preset": args.preset} if args.preset else {}), **_given(args, model_fields)}
    if "preset" not in model:
        missing = [_flag_of(f) for f in ("layers", "hidden", "heads", "vocab", "seq_len") if f not in model]
        if missing:
            raise ValueError(f"no model: give --preset NAME, --config FILE with a model: section, or {', '.join(missing)}")
    if args.plot and args.sweep is None:
        raise ValueError("--plot draws the sequence sweep: add --sweep (default 4K:128K)")
    for field in STEP_TIME_ONLY:
        if getattr(args, field) is not None and not args.hardware:
            flag = _flag_of(field)
            raise ValueError(f"{flag} / --no-{flag[2:]} changes only the step time: add --hardware NAME")
    try:
        config = build_config(model, where=f"{args.config}: model" if args.config else "model")
        strategy = build_strategy({**spec["strategy"], **_given(args, strategy_fields)},
                                  where=f"{args.config}: strategy" if args.config else "strategy")
        device_memory = args.device_memory if args.device_memory is not None else spec["device_memory"]
        result = estimate_job(config, strategy, device_memory)
        step = estimate_step_time(config, strategy, args.hardware) if args.hardware else None
    except ValueError as exc:
        raise ValueError(_flag_message(exc, model_fields + strategy_fields)) from None
    fit = {}
    if device_memory is not None:
        fit = {field: largest_fitting(config, strategy, device_memory, field) for field in ("micro_batch", "seq_len")}
    sweep = sequence_sweep(config, strategy, args.sweep, device_memory) if args.sweep is not None else []
    cp = strategy.context_parallel
    plain = sequence_sweep(config, strategy.with_(context_parallel=1), args.sweep, device_memory) \
        if sweep and cp > 1 else []
    if args.plot:
        plot_sweep(sweep, args.plot)
    if args.json:
        out = result.to_dict()
        out["largest_fitting"] = fit
        out["sweep"] = [{"seq_len": e.config.seq_len, "peak_stage": e.peak.stage, **e.peak.to_dict()} for e in sweep]
        if plain:
            for row, base in zip(out["sweep"], plain):
                row["without_context_parallel"] = {"total": base.peak.total, "fits": base.fits}
        out["plot"] = args.plot
        out["step_time"] = step.to_dict() if step is not None else None
        print(json.dumps(out, indent=2))
        return 0
    print(result)
    if fit:
        print(f"largest micro-batch that fits {format_bytes(device_memory)}: {fit['micro_batch'] or 'none'} "
              f"(at seq {config.seq_len}); longest sequence: {fit['seq_len'] or 'none'} "
              f"(at micro-batch {config.micro_batch})")
    if step is not None:
        print(step)
    if sweep:
        print("sequence sweep (peak stage per length):")
        for i, e in enumerate(sweep):
            s = e.peak
            fits = "" if e.fits is None else ("  fits" if e.fits else "  does NOT fit")
            line = (f"  seq {e.config.seq_len:>7}: {format_bytes(s.total):>11} (stage {s.stage}: activations "
                    f"{format_bytes(s.activations)}, kv cache {format_bytes(s.kv_cache)}){fits}")
            if plain:
                base = plain[i]
                verdict = "" if base.fits is None else (", fits" if base.fits else ", does NOT fit")
                line += f"; without context parallel {format_bytes(base.peak.total)}{verdict}"
            print(line)
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
