"""Layer-zoo sweep: every `layer_catalog` layer inside its small model, trained one step in
simulation under several strategies, batched execution on and off, against one device.

Per case the single-device reference runs once: the loss (the model's output times a fixed
random projection, summed: every output element gets its own gradient), the gradients of every
trainable parameter and the parameters and buffers after one `nn.Momentum` step (plain momentum
SGD: Adam would blow float noise on a zero gradient up to full steps). Then, for each strategy
of `STRATEGIES` with `Execution.batch_shards` on (and for those of `PER_SHARD_TOO` also off: the
per-shard path), a fresh copy of the model (same
seed, same weights) runs the same step through `auto_parallelize`; loss, gradients and
parameters must equal the reference to `RTOL` relative (of each tensor's largest magnitude; for
gradients, of the model's largest gradient; for the loss, of the sum of its terms' magnitudes), or
the run must raise `DTensorOpError` naming the op. Anything else (another exception, a wrong
value) is a failure of the case.

`python -m mindspore_hyper.tools.coverage.layer_sweep --json PATH` writes each case's
outcome (what `tests/runtime/simulation/test_layer_zoo.py` reads); `--write` replaces the layer-zoo section
of docs/op_coverage.md (after the op table of `mindspore_hyper.tools.coverage.op_sweep`) with the
sweep's table (about 60 s with synchronous kernel launches and the optimizer run eagerly, see `main`).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.context import set_context
from mindspore_hyper.tools.coverage import op_sweep
from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.tools.coverage.layer_catalog import LAYERS, NOT_ON_CPU, LayerCase
from mindspore_hyper.runtime.simulation.runtime import simulate
from mindspore_hyper.shard.layout import Layout

__all__ = ["STRATEGIES", "PER_SHARD_TOO", "runs_per_layer", "RTOL", "LayerResult", "run_layer", "render", "main",
           "SECTION"]

RTOL = 1e-5
LEARNING_RATE, MOMENTUM = 0.1, 0.9
SECTION = op_sweep.LAYER_SECTION


def _tensor_dim(dim: int) -> Callable[[nn.Cell], object]:
    """Mesh data 2 x tensor 2: every parameter split over "tensor" on dimension `dim` where it
    has one that divides (the rest replicated); the batch split over "data"."""
    def strategy(net: nn.Cell):
        s = Layout((2, 2), ("data", "tensor"))(tensor_map=())
        for name, param in net.parameters_and_names():
            if len(param.shape) > dim and param.shape[dim] % 2 == 0:
                s.override(name, *([None] * dim + ["tensor"]))
        return s
    return strategy


def _data_parallel(net: nn.Cell):
    return Layout((4,), ("data",))(tensor_map=())


def _zero_3d(net: nn.Cell):
    return Layout((2, 2, 2), ("data", "tensor", "pipeline"))(tensor_map=("tensor", None), optimizer_state="data")


# label -> (what it does, the strategy for a built model)
STRATEGIES: Dict[str, Tuple[str, Callable[[nn.Cell], object]]] = {
    "tensor dim 0": ("mesh data 2 x tensor 2, every parameter split over tensor on dimension 0 where it divides, "
                     "the batch over data", _tensor_dim(0)),
    "tensor dim 1": ("the same on dimension 1", _tensor_dim(1)),
    "data parallel": ("mesh data 4, parameters replicated, the batch split four ways", _data_parallel),
    "3-D + ZeRO-1": ("mesh data 2 x tensor 2 x pipeline 2, the one pattern (\"tensor\", None) for every "
                     "parameter, optimizer states split over data", _zero_3d),
}

# Strategies also run with batched execution off (the per-shard path): one 2-D and the 3-D mesh.
PER_SHARD_TOO = ("tensor dim 0", "3-D + ZeRO-1")


def runs_per_layer() -> int:
    """How many simulated runs each layer gets."""
    return len(STRATEGIES) + len(PER_SHARD_TOO)


@dataclass
class LayerResult:
    """The outcome of one case over every strategy and batching mode.

    Attributes:
        case: the case.
        passed: run labels ("<strategy>, batched" / ", per shard") that matched one device.
        refused: run label -> the DTensorOpError message (names the op).
        failed: run label -> what went wrong (a wrong value or an error not naming an op).
        fallbacks: MindSpore ops that ran by the replicated fallback in some run (sorted).
    """

    case: LayerCase
    passed: List[str] = field(default_factory=list)
    refused: Dict[str, str] = field(default_factory=dict)
    failed: Dict[str, str] = field(default_factory=dict)
    fallbacks: List[str] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the case (not part of the table)

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict:
        return {"name": self.case.name, "passed": self.passed, "refused": self.refused, "failed": self.failed,
                "fallbacks": self.fallbacks}

    @classmethod
    def from_dict(cls, data: dict, case: LayerCase) -> "LayerResult":
        return cls(case, list(data["passed"]), dict(data["refused"]), dict(data["failed"]), list(data["fallbacks"]))


class _Loss(nn.Cell):
    """The model's (first) output times a fixed random projection, summed."""

    def __init__(self, model: nn.Cell):
        super().__init__()
        self.model = model
        self._projections: Dict[Tuple[int, ...], Tensor] = {}
        self.terms_magnitude = 0.0

    def construct(self, x):
        out = self.model(x)
        out = out[0] if isinstance(out, (tuple, list)) else out
        shape = tuple(out.shape)
        if shape not in self._projections:
            rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
            self._projections[shape] = Tensor(rng.standard_normal(shape).astype(np.float32))
        terms = out * self._projections[shape]
        if not isinstance(terms, DTensor):  # one device: the magnitude the loss's sum errs relative to
            self.terms_magnitude = float(terms.abs().sum().asnumpy())
        return terms.sum()


def _input(case: LayerCase) -> Tensor:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    if case.kind == "ids":
        return Tensor(rng.integers(0, 50, case.shape).astype(np.int32))
    return Tensor(rng.standard_normal(case.shape).astype(np.float32))


def _build(case: LayerCase) -> _Loss:
    ms.set_seed(7)
    np.random.seed(7)
    net = _Loss(case.build())
    net.set_train(case.train)
    return net


def _values(net: nn.Cell) -> Dict[str, np.ndarray]:
    return {name: p.asnumpy() for name, p in net.parameters_and_names()}


def _reference(case: LayerCase, x: Tensor):
    net = _build(case)
    optimizer = nn.Momentum(net.trainable_params(), LEARNING_RATE, MOMENTUM)
    loss, grads = ms.value_and_grad(net, None, optimizer.parameters)(x)
    optimizer(grads)
    grads = {p.name: g.asnumpy() for p, g in zip(optimizer.parameters, grads)}
    return float(loss.asnumpy()), net.terms_magnitude, grads, _values(net)


def _differs(name: str, got: np.ndarray, want: np.ndarray, scale: Optional[float] = None) -> str:
    """What differs beyond `RTOL` times `scale` (default: `want`'s largest magnitude)."""
    if got.shape != want.shape:
        return f"{name}: shape {got.shape}, expected {want.shape}"
    if scale is None:
        scale = float(np.abs(want).max()) if want.size else 0.0
    error = float(np.abs(got - want).max()) if want.size else 0.0
    if error > RTOL * scale:
        return f"{name}: max abs difference {error:.3g} (tolerance {RTOL * scale:.3g})"
    return ""


def _simulated(case: LayerCase, x: Tensor, strategy, batched: bool):
    net = _build(case)
    s = strategy(net)
    set_context(mode="simulation", device_num=s.mesh.size)
    parallel = simulate(net, s)
    parallel.execution.batch_shards = batched
    optimizer = nn.Momentum(parallel.optimizer_parameters(), LEARNING_RATE, MOMENTUM)
    loss = parallel.train_step(optimizer, x)
    return float(loss.asnumpy()), dict(parallel.last_gradients), _values(net), sorted(parallel.report().fallbacks)


def run_layer(case: LayerCase, strategies: Optional[Sequence[str]] = None) -> LayerResult:
    """Run `case` single-device and under every strategy, batched and per shard.

    Raises:
        RuntimeError: the single-device reference itself fails (the case is not valid here).
    """
    start = time.perf_counter()
    x = _input(case)
    try:
        ref_loss, loss_scale, ref_grads, ref_values = _reference(case, x)
    except Exception as error:
        raise RuntimeError(f"layer case {case.name!r}: the single-device reference fails: {error}") from error
    result = LayerResult(case)
    grad_scale = max((float(np.abs(g).max()) for g in ref_grads.values() if g.size), default=0.0)
    fallbacks = set()
    for label in strategies or list(STRATEGIES):
        for batched in (True, False) if label in PER_SHARD_TOO else (True,):
            run = f"{label}, {'batched' if batched else 'per shard'}"
            try:
                loss, grads, values, run_fallbacks = _simulated(case, x, STRATEGIES[label][1], batched)
            except DTensorOpError as error:
                result.refused[run] = str(error).splitlines()[0]
                continue
            except Exception as error:  # not a refusal naming the op
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                result.failed[run] = f"{type(error).__name__}: {first}"
                continue
            fallbacks |= set(run_fallbacks)
            problems = [_differs("loss", np.array(loss), np.array(ref_loss), loss_scale)]
            # a float sum errs relative to its terms, not to its result: gradients are compared
            # relative to the model's largest gradient (a gradient that is 0 in exact arithmetic,
            # e.g. a bias before BatchNorm, is float noise in both runs)
            problems += [_differs(f"gradient {n}", grads[n], g, grad_scale) if n in grads else f"gradient {n} missing"
                         for n, g in ref_grads.items()]
            problems += [_differs(n, values[n], v) for n, v in ref_values.items()]
            problems = [p for p in problems if p]
            if problems:
                result.failed[run] = "; ".join(problems[:3])
            else:
                result.passed.append(run)
    result.fallbacks = sorted(fallbacks)
    result.seconds = time.perf_counter() - start
    return result


def run_all(cases: Sequence[LayerCase] = LAYERS) -> List[LayerResult]:
    return [run_layer(case) for case in cases]


def render(results: Sequence[LayerResult]) -> str:
    """The layer-zoo section of docs/op_coverage.md for `results` (the heading first)."""
    runs = runs_per_layer()
    lines = [
        SECTION,
        "",
        "Generated by `python -m mindspore_hyper.tools.coverage.layer_sweep --write` (do not edit; "
        "`tests/runtime/simulation/test_layer_zoo.py` fails when it is stale). "
        f"{len(results)} `mindspore.nn` layer classes that run on CPU, each in a "
        "small model (a layer without parameters after a Dense or 1x1 convolution), trained one step (forward, "
        "gradients, one momentum-SGD update; buffers such as BatchNorm's moving statistics included) under "
        f"{len(STRATEGIES)} strategies — "
        + "; ".join(f"**{label}**: {text}" for label, (text, _) in STRATEGIES.items())
        + " — each with batched execution on, and " + " and ".join(f"**{label}**" for label in PER_SHARD_TOO)
        + f" also with it off ({runs} runs per layer), against the same step on one device "
        f"(relative {RTOL:g} of each tensor's largest magnitude; gradients of the largest gradient). "
        "A run either matches or is refused with an error "
        "naming the op; none crashes or gives a wrong value.",
        "",
        f"| layer | runs matching one device (of {runs}) | refused | replicated fallback for | note |",
        "|---|---:|---|---|---|",
    ]
    for r in results:
        refused = sorted(set(message.split(":")[0] for message in r.refused.values()))
        failed = "; ".join(f"{k}: {v}" for k, v in r.failed.items()).replace("|", "/")
        note = "; ".join(x for x in (r.case.note, f"FAILED {failed}" if failed else "") if x)
        lines.append(f"| `{r.case.name}` | {len(r.passed)} | {', '.join(refused) or '-'} | "
                     f"{', '.join(r.fallbacks) or '-'} | {note} |")
    lines += ["", "Not swept: layer classes MindSpore 2.10 does not run on CPU even on one device.", "",
              "| layer | MindSpore's error on CPU |", "|---|---|"]
    lines += [f"| `{name}` | {reason} |" for name, reason in NOT_ON_CPU.items()]
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the sweep; --json PATH writes each case's outcome. Returns 1 if a case failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write each case's outcome to this JSON file")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument("--write", action="store_true", help="replace the layer-zoo section of --output")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parents[3] / "docs" / "op_coverage.md")
    args = parser.parse_args(argv)
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)  # thousands of tiny kernels
    # nn.Momentum's `@jit` construct runs eagerly (MindSpore's MS_JIT=0): with a fresh model per run
    # it would compile a graph each time, ~40% of the sweep's CPU time; the sweep checks the layers'
    # rules, the optimizers' compiled path is trained by the runtime tests
    os.environ["MS_JIT"] = "0"
    cases = [c for c in LAYERS if not args.only or c.name in args.only]
    results = run_all(cases)
    bad = [r for r in results if not r.ok]
    for r in results:
        print(f"{r.case.name}: {r.seconds:.2f} s, {len(r.passed)} passed, {len(r.refused)} refused"
              + (f", FAILED {r.failed}" if r.failed else ""), file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
    if args.write:
        if args.only:
            raise SystemExit("--write needs the whole sweep (drop --only)")
        document = args.output.read_text()
        args.output.write_text(op_sweep.ops_section(document) + "\n" + render(results))
        print(f"wrote the layer zoo of {args.output}: {len(results)} layers, {len(bad)} not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
