"""`mindspore-hyper plan --search`: rank parallel strategies for a transformer on N devices of a
hardware preset with the step-time model (mindspore_hyper.estimate.search; no simulation)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from mindspore_hyper.cli.arg_types import int_list, is_terminal, positive_int

__all__ = ["add_search_arguments", "run_search"]

MODEL_FIELDS = ("layers", "hidden", "heads", "vocab", "seq_len", "ffn", "kv_heads", "experts", "top_k")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The --search flags of `plan`."""
    from mindspore_hyper.estimate import PRESETS, hardware_presets

    g = parser.add_argument_group("search (--search: rank strategies for a cluster with the step-time model)")
    g.add_argument("--search", action="store_true",
                   help="enumerate data/tensor/pipeline/context/expert sizes, ZeRO, recomputation, micro-batch and "
                        "schedule; keep what fits the device; print the fastest by predicted step time")
    g.add_argument("--preset", choices=sorted(PRESETS), help="--search: the model (or the flags below)")
    for name in MODEL_FIELDS:
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=positive_int, metavar="N",
                       help=f"--search: model {name}")
    g.add_argument("--devices", type=positive_int, metavar="N", help="--search: devices of the job")
    g.add_argument("--hardware", default="a100-80gb", metavar="NAME",
                   help=f"--search: hardware preset ({', '.join(hardware_presets())}) or .yaml (default a100-80gb)")
    g.add_argument("--global-batch", dest="global_batch", type=positive_int, metavar="N",
                   help="--search: sequences per step")
    g.add_argument("--top", type=positive_int, default=5, metavar="N", help="--search: results shown (default 5)")
    g.add_argument("--micro-batches", dest="micro_batches", type=int_list, default=[1, 2, 4, 8], metavar="LIST",
                   help="--search: micro-batch sizes to try (default 1,2,4,8)")
    g.add_argument("--verify", action="store_true",
                   help="--search: simulate one step of the best strategy the CPU simulation runs (examples/"
                        "models.py's GPT shape; float32): loss vs one device, model-state bytes vs the estimate")
    g.add_argument("--memory-fraction", dest="memory_fraction", type=float, default=0.9, metavar="F",
                   help="--search: share of the device memory a strategy may use (default 0.9)")


def _config(args: argparse.Namespace):
    from mindspore_hyper.estimate import TransformerConfig, preset

    given = {k: getattr(args, k) for k in MODEL_FIELDS if getattr(args, k) is not None}
    if args.preset:
        return preset(args.preset).with_(**given)
    missing = [f"--{k.replace('_', '-')}" for k in ("layers", "hidden", "heads", "vocab", "seq_len") if k not in given]
    if missing:
        raise ValueError(f"--search needs a model: --preset NAME, or {', '.join(missing)}")
    return TransformerConfig(**given)


def _progress(done: int, total: int) -> None:
    if total >= 200 and (done % max(total // 40, 1) == 0 or done == total):
        width = 30
        filled = width * done // total
        sys.stderr.write(f"\rsearch [{'#' * filled}{'.' * (width - filled)}] {done}/{total} layouts")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def run_search(args: argparse.Namespace) -> int:
    """Search, print the top strategies with their memory and time breakdowns (or JSON), plot the front."""
    from mindspore_hyper.estimate import format_bytes
    from mindspore_hyper.estimate.search import fitting_candidates, plot_front, refine_candidates

    for flag in ("devices", "global_batch"):
        if getattr(args, flag) is None:
            raise ValueError(f"--search needs --{flag.replace('_', '-')}")
    config = _config(args)
    start = time.perf_counter()
    candidates = fitting_candidates(config, args.devices, args.hardware, args.global_batch,
                                    micro_batches=args.micro_batches, memory_fraction=args.memory_fraction,
                                    progress=_progress if not args.json and is_terminal(sys.stderr) else None)
    results = refine_candidates(candidates, args.hardware, args.top)
    elapsed = time.perf_counter() - start
    if args.plot and results:
        plot_front(candidates, args.plot)
    verification = _verify(results) if args.verify and results else None
    if args.json:
        print(json.dumps({"verify": verification and _verification_dict(verification),
                          "seconds_searched": elapsed, "plot": args.plot if results else None,
                          "fitting": len(candidates),
                          "results": [{"strategy": r.strategy.to_dict(), "micro_batch": r.config.micro_batch,
                                       "describe": r.describe(), "memory": r.memory.to_dict(),
                                       "estimate": r.estimate.to_dict()} for r in results]}, indent=2))
        return 0
    print(f"searched in {elapsed:.2f} s: {config.total_params() / 1e9:.2f}B parameters, seq {config.seq_len}, "
          f"global batch {args.global_batch} on {args.devices} x {args.hardware}; {len(candidates)} strategies fit")
    if not results:
        print("nothing fits: try more devices, a larger --memory-fraction or smaller micro-batches")
        return 0
    for rank, r in enumerate(results, 1):
        m = r.memory
        print(f"\n#{rank} {r.describe()}: step {r.seconds:.4g} s, MFU {r.estimate.mfu:.1%}, "
              f"{r.estimate.tokens_per_second:,.0f} tokens/s")
        print(f"   memory (stage {m.stage}): {format_bytes(m.total)} = parameters {format_bytes(m.parameters)}, "
              f"gradients {format_bytes(m.gradients)}, optimizer {format_bytes(m.optimizer_states)}, "
              f"activations {format_bytes(m.activations)}")
        print("   time: " + ", ".join(f"{k} {v:.4g} s" for k, v in r.estimate.breakdown.items()))
    if verification is not None:
        v = verification
        worst = max(v.comparisons, key=lambda c: abs(c.estimated - c.measured))
        memory = "equal to the estimate on every device" if v.memory_exact else \
            f"differ (worst: device {worst.rank} {worst.kind} {worst.estimated} vs {worst.measured})"
        print(f"\nverify: {v.result.describe()} simulated on {v.strategy.devices} devices (float32, one step): loss "
              f"{v.simulated_loss:.6f} vs {v.single_loss:.6f} on one device (relative {v.loss_relative_error:.1e}); "
              f"parameters, gradients and optimizer states {memory}")
    if args.plot:
        print(f"\nplot: {args.plot}")
    return 0


def _verify(results):
    from mindspore_hyper.cli.model_spec import GPT_PRESET, load_model_class
    from mindspore_hyper.estimate.verify import verify_search_result

    return verify_search_result(results, load_model_class(GPT_PRESET))


def _verification_dict(v) -> dict:
    return {"describe": v.result.describe(), "strategy": v.strategy.to_dict(), "single_loss": v.single_loss,
            "simulated_loss": v.simulated_loss, "loss_relative_error": v.loss_relative_error,
            "memory_exact": v.memory_exact,
            "devices": [{"rank": c.rank, "stage": c.stage, "kind": c.kind, "estimated": c.estimated,
                         "simulated": c.measured} for c in v.comparisons]}
