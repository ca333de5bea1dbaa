"""`mindspore-hyper plan`: resolve a strategy for a model and simulate one step on this CPU."""
from __future__ import annotations

import argparse
import json
import os

from mindspore_hyper.cli.arg_types import byte_size, positive_int
from mindspore_hyper.cli.common import add_command, add_model_arguments, check_model_arguments
from mindspore_hyper.cli.model_spec import GPT_DEFAULTS, GPT_PRESET, build_model, gpt_inputs, make_inputs
from mindspore_hyper.cli.plan_groups import simulate_groups
from mindspore_hyper.cli.plan_search import MODEL_FIELDS, add_search_arguments, run_search

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  mindspore-hyper plan --data 2 --tensor 4 --zero 1
      (the GPT preset, examples/models.py, on 8 simulated devices; with the estimate beside it)
  mindspore-hyper plan --init-args '{"layers": 4, "hidden": 128}' --batch 16 --data 2 --pipeline 2
  mindspore-hyper plan --model <your_module>:<YourCell> --init-args '{"dim": 64}' --inputs float32:8x64 \\
      --config configs/tensor_parallel_8.yaml --forward-only --json
  mindspore-hyper plan --search --preset llama2-70b --devices 1024 --hardware h100-80gb \
      --global-batch 1024 --top 5 --plot front.png
      (no simulation: strategies ranked by the step-time model, docs/estimate.md)
  mindspore-hyper plan --model <your_module>:<YourCell> --inputs float32:8x64 --data 2 --zero 1
      (--data and --zero lay out any model; --tensor and --pipeline the GPT's parameters by name,
       another model takes a parallel config YAML, see docs/config.md)"""

OPTIMIZERS = ("adam", "momentum", "sgd")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `plan` subcommand."""
    p = add_command(subparsers, "plan", "resolve a strategy and simulate one step: memory and collectives",
                    "Resolve a parallel strategy for a model (where every parameter lives, per device) and simulate "
                    "one training step on this CPU: memory per device, collectives per mesh axis, replication "
                    "fallbacks. The activation figure counts every tensor the training forward creates, held until "
                    "the step ends (docs/estimate.md).", EXAMPLES)
    add_model_arguments(p, "'gpt' (examples/models.py GPT, the default) or package.module:Class",
                        "model inputs as DTYPE:SHAPE[:HIGH], e.g. int32:8x16:128 float32:8x64 (gpt: token ids and "
                        "labels of --batch x seq)")
    layout = p.add_argument_group("strategy (a parallel config YAML, or the GPT layout flags)")
    layout.add_argument("--config", metavar="YAML", help="a parallel config file (docs/config.md)")
    layout.add_argument("--data", type=positive_int, help="GPT layout: data-parallel size")
    layout.add_argument("--tensor", type=positive_int, help="GPT layout: Megatron tensor-parallel size")
    layout.add_argument("--pipeline", type=positive_int, help="GPT layout: pipeline stages over blocks.*")
    layout.add_argument("--zero", type=int, choices=(0, 1, 3),
                        help="GPT layout: 1 shards optimizer states over data, 3 parameters too")
    run_group = p.add_argument_group("step")
    run_group.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                           help="optimizer whose states are counted (default adam)")
    run_group.add_argument("--forward-only", dest="forward_only", action="store_true",
                           help="simulate the forward only (the model may return any output)")
    run_group.add_argument("--device-memory", dest="device_memory", type=byte_size, metavar="SIZE",
                           help="per-device budget the report checks (default: the context flag, 64GiB)")
    run_group.add_argument("--topology", help="topology preset or YAML for the communication-time estimate")
    out = p.add_argument_group("output")
    out.add_argument("--plot", metavar="PNG", help="save the report's memory and communication plot (with --search: "
                                                   "the time/memory front of the strategies found)")
    out.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_search_arguments(p)
    p.set_defaults(func=run, parser=p)
    return p


_SEARCH_ONLY = ("preset", "devices", "global_batch") + MODEL_FIELDS


def _optimizer_factory(name: str):
    from mindspore import nn

    return {"adam": lambda ps: nn.Adam(ps, learning_rate=1e-3),
            "momentum": lambda ps: nn.Momentum(ps, learning_rate=1e-3, momentum=0.9),
            "sgd": lambda ps: nn.SGD(ps, learning_rate=1e-3)}[name]


def _gpt_strategy(args: argparse.Namespace):
    from mindspore_hyper.estimate import JobStrategy

    sizes = {k: getattr(args, k) for k in ("data", "tensor", "pipeline") if getattr(args, k) is not None}
    return JobStrategy(zero_stage=args.zero or 0, **sizes)


def _gpt_estimate(args: argparse.Namespace, table, report) -> list:
    """Estimated vs simulated bytes per pipeline stage (the GPT preset with the layout flags), for
    the JobStrategy read off the resolved `table` (`job_strategy_of`: the layout that ran)."""
    from mindspore_hyper.estimate import TransformerConfig
    from mindspore_hyper.estimate.crosscheck import compare
    from mindspore_hyper.estimate.resolved_job import job_strategy_of

    strategy = job_strategy_of(table)
    kwargs = {**GPT_DEFAULTS, **args.init_args}
    config = TransformerConfig(layers=kwargs["layers"], hidden=kwargs["hidden"], heads=kwargs["heads"],
                               vocab=kwargs["vocab"], seq_len=kwargs["seq"], micro_batch=args.batch // strategy.data,
                               dtype_bytes=4)
    simulated = strategy.tensor == 1 and strategy.zero_stage != 3
    strategy = strategy.with_(activation_model="simulation" if simulated else "megatron")
    rows = compare(config, strategy, report)
    return [{"rank": r.rank, "stage": r.stage, "kind": r.kind, "estimated": r.estimated, "simulated": r.measured,
             "compared": r.kind != "activations" or simulated} for r in rows]


def _any_model_config(args: argparse.Namespace, strategy) -> dict:
    """The layout flags on a model other than the GPT preset: --data (and --zero) need no
    parameter names; --tensor and --pipeline split the GPT's by name, so another model needs a
    config naming its own Cells."""
    named = [f"--{k} {getattr(args, k)}" for k in ("tensor", "pipeline") if (getattr(args, k) or 1) > 1]
    if named:
        raise ValueError(f"{', '.join(named)}: these flags split the GPT preset's parameters by their names; for "
                         f"--model {args.model} give a parallel config naming its Cells (--config YAML, docs/config.md)")
    config = {"device_matrix": [strategy.data], "alias_names": ["data"],
              "optimizer": {"sharding": strategy.zero_stage >= 1}}
    if strategy.zero_stage == 3:
        config["tensor_map"] = ["data"]  # every parameter split along its first dimension that divides
    return {"parallel_config": config}


def run(args: argparse.Namespace) -> int:
    """Resolve, simulate one step, print the strategy table and the report (and the estimate).

    A config with device groups is planned as the MPMD job it builds (cli/plan_groups.py): the
    table shows each group's mesh and rows."""
    import mindspore_hyper as mh
    from mindspore_hyper.estimate.crosscheck import simulate_step
    from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config

    layout_flags = [f"--{k}" for k in ("data", "tensor", "pipeline", "zero") if getattr(args, k) is not None]
    if args.search:
        if layout_flags or args.config:
            raise ValueError(f"--search chooses the strategy; drop {', '.join(layout_flags or ['--config'])}")
        return run_search(args)
    stray = [f"--{k.replace('_', '-')}" for k in _SEARCH_ONLY if getattr(args, k) is not None]
    if stray:
        raise ValueError(f"{', '.join(stray)}: only with --search")
    if args.config and layout_flags:
        raise ValueError(f"--config and {', '.join(layout_flags)} both give the strategy; use one")
    if not args.config and not layout_flags:
        raise ValueError("no strategy: give --config YAML, or --data/--tensor/--pipeline/--zero (GPT layout)")
    check_model_arguments(args, "float32:8x64")
    if args.config and not os.path.isfile(args.config):
        raise FileNotFoundError(f"--config {args.config}: no such file")
    strategy = None if args.config else _gpt_strategy(args)
    if strategy is not None and args.inputs is None and args.batch % strategy.data:
        raise ValueError(f"--batch {args.batch} must divide by --data {strategy.data}")
    if args.config:
        config = args.config
    elif args.model == GPT_PRESET:
        config = gpt_parallel_config(strategy)
    else:
        config = _any_model_config(args, strategy)
    context = {k: getattr(args, k) for k in ("device_memory", "topology") if getattr(args, k) is not None}
    mh.set_context(**context)
    model = build_model(args.model, args.init_args)
    inputs = make_inputs(args.inputs or gpt_inputs(args.init_args, args.batch))
    config = mh.load_parallel_config(config)
    if config.groups:  # each group its own program: the built MPMD job's table (every group's mesh and rows)
        table, report = simulate_groups(model, config, inputs, _optimizer_factory(args.optimizer),
                                        backward=not args.forward_only)
    else:
        table = mh.resolve_strategy(model, config)
        report = simulate_step(model, config, inputs, optimizer=_optimizer_factory(args.optimizer),
                               backward=not args.forward_only)
    estimate, unavailable = [], None
    if (args.model == GPT_PRESET and strategy is not None and args.inputs is None and not args.forward_only
            and args.optimizer == "adam"):
        try:
            estimate = _gpt_estimate(args, table, report)
        except ValueError as exc:  # a layout the simulation runs but the estimator's model does not cover
            unavailable = f"the estimator does not cover this layout: {exc}"
    if args.plot:
        report.plot(args.plot)
    if args.json:
        print(json.dumps({"strategy_table": table.to_dict(), "report": report.to_dict(), "estimate": estimate,
                          "estimate_unavailable": unavailable, "plot": args.plot}, indent=2))
        return 0
    print(table)
    print()
    print(report)
    if estimate:
        print()
        print(_estimate_text(estimate))
    if unavailable:
        print()
        print(f"estimate: {unavailable}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _estimate_text(rows: list) -> str:
    from mindspore_hyper.estimate import format_bytes

    lines = ["estimate (mindspore_hyper.estimate) vs simulated, device 0 of each pipeline stage:",
             f"{'stage':>5}  {'kind':<16} {'estimated':>12} {'simulated':>12}  difference"]
    seen = set()
    for r in rows:
        if (r["stage"], r["kind"]) in seen:
            continue
        seen.add((r["stage"], r["kind"]))
        if r["compared"]:
            diff = "exact" if r["estimated"] == r["simulated"] else \
                f"{(r['estimated'] - r['simulated']) / max(r['simulated'], 1):+.2%}"
        else:
            diff = "not comparable (Table 2's 16-bit count vs the simulation's live tensors)"
        lines.append(f"{r['stage']:>5}  {r['kind']:<16} {format_bytes(r['estimated']):>12} "
                     f"{format_bytes(r['simulated']):>12}  {diff}")
    return "\n".join(lines)
