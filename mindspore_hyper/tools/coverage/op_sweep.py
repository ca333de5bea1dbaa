"""Op-coverage sweep: every op of the catalog on DTensors laid out every way, against one device.

For each `OpCase` of `op_catalog.CATALOG`, the inputs are drawn at random and the op runs once
on plain tensors (the single-device reference) and once per layout variant on a 2x2 mesh: each
input split along each of its dimensions in turn, the first input split over both mesh axes or
along two dimensions, a Partial(sum) first input, plain tensors with the last input a DTensor
(all replicated when nothing splits). Each run must match the reference (values, shapes, dtypes) or raise `DTensorOpError`
naming the op; a result's shards must cover its global tensor with agreeing replicas (assembled
in numpy by `shard.reference_executor`, not by the collectives under test). The outcome says, per op, which MindSpore ops it dispatched and whether they ran
by a sharding rule or by the replicated fallback.

`python -m mindspore_hyper.tools.coverage.op_sweep` writes docs/op_coverage.md (about 5 s with
synchronous kernel launches; the layer-zoo section after the table, written by
`python -m mindspore_hyper.tools.coverage.layer_sweep --write`, is kept); `--check` only compares it with the sweep (exit status 1 if
stale or if an op is not ok); `--json PATH` writes each op's outcome instead (what the test
reads).
"""
from __future__ import annotations

import argparse
import json
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor

from mindspore_hyper.dtensor.accounting import Accounting, use_accounting
from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.dtensor.dtensor import DTensor, key_of, significant_axes
from mindspore_hyper.dtensor.execution import distribute_tensor
from mindspore_hyper.tools.coverage.op_catalog import CATALOG, Arg, OpCase
from mindspore_hyper.shard import reference_executor
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["MESH", "LAYER_SECTION", "CaseResult", "Variant", "variants", "run_case", "render", "ops_section",
           "layers_section", "main"]

MESH = Layout((2, 2), ("a", "b"))
# The heading of the layer-zoo section that follows the op table in docs/op_coverage.md
# (`tools/coverage/layer_sweep.py` writes it; regenerating the op table keeps it).
LAYER_SECTION = "## Layer zoo"
RTOL, ATOL = 1e-4, 1e-5


@dataclass(frozen=True)
class Variant:
    """One way to pass the case's inputs: a layout per tensor input, or None for a plain Tensor."""

    label: str
    layouts: Tuple[Optional[TensorLayout], ...]


@dataclass
class CaseResult:
    """The outcome of one case over all its variants.

    Attributes:
        case: the case.
        dispatched: MindSpore op names the DTensor runs dispatched (sorted).
        fallbacks: op names that ran by the replicated fallback in some variant (sorted).
        refusal: the DTensorOpError message when the op is refused on DTensors, else None.
        mismatches: variant label -> what differed from the single-device result.
        unclear: variant label -> an exception that is not a DTensorOpError naming the op.
    """

    case: OpCase
    dispatched: List[str] = field(default_factory=list)
    fallbacks: List[str] = field(default_factory=list)
    refusal: Optional[str] = None
    mismatches: Dict[str, str] = field(default_factory=dict)
    unclear: Dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.case.name, "dispatched": self.dispatched, "fallbacks": self.fallbacks,
                "refusal": self.refusal, "mismatches": self.mismatches, "unclear": self.unclear}

    @classmethod
    def from_dict(cls, data: dict, case: OpCase) -> "CaseResult":
        """The outcome `to_dict` wrote, for `case`."""
        return cls(case, list(data["dispatched"]), list(data["fallbacks"]), data["refusal"],
                   dict(data["mismatches"]), dict(data["unclear"]))

    @property
    def ok(self) -> bool:
        """Every variant matched or was refused with an error naming the op."""
        return not self.mismatches and not self.unclear

    @property
    def handling(self) -> str:
        if self.refusal is not None:
            return "refused"
        if not self.dispatched:
            return "no dispatch"
        if not self.fallbacks:
            return "rule"
        if set(self.fallbacks) >= set(self.dispatched):
            return "replicated"
        return "rule + replicated"


# -- inputs ---------------------------------------------------------------------------------------

def make_inputs(case: OpCase) -> List[Tensor]:
    """The case's random inputs (seeded by its name, so every run draws the same values)."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    return [Tensor(_draw(rng, arg)) for arg in case.args]


def _draw(rng, arg: Arg) -> np.ndarray:
    shape, kind = arg.shape, arg.kind
    if kind == "float":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "positive":
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "unit":
        return rng.uniform(-0.9, 0.9, shape).astype(np.float32)
    if kind == "prob":
        return rng.uniform(0.05, 0.95, shape).astype(np.float32)
    if kind == "int":
        return rng.integers(-8, 9, shape).astype(np.int32)
    if kind == "bool":
        return rng.random(shape) < 0.5
    if kind.startswith("distinct"):
        return np.argsort(rng.random((int(kind[len("distinct"):]),) + shape[1:]), axis=0)[:shape[0]].astype(np.int32)
    if kind.startswith("index"):
        return rng.integers(0, int(kind[len("index"):]), shape).astype(np.int32)
    if kind == "sorted":
        return np.sort(rng.standard_normal(shape), axis=-1).astype(np.float32)
    raise ValueError(f"Arg.kind {kind!r} unknown")


# -- layout variants ------------------------------------------------------------------------------

def variants(case: OpCase, mesh: Layout = MESH) -> List[Variant]:
    """The layout variants of the module docstring, for `case`'s input shapes."""
    args = case.args
    replicated = tuple(TensorLayout.replicated(mesh, len(a.shape)) for a in args)
    out = [Variant("replicated", replicated)]

    def with_layout(i, layout):
        return tuple(layout if j == i else r for j, r in enumerate(replicated))

    for i, arg in enumerate(args):
        for d, size in enumerate(arg.shape):
            if size % 2 == 0:
                out.append(Variant(f"input {i} split on dim {d} over a", with_layout(i, _split(mesh, arg, {d: ("a",)}))))
    shape = args[0].shape if args else ()
    if len(shape) >= 2 and shape[0] % 2 == 0 and shape[-1] % 2 == 0:
        out.append(Variant("input 0 split on dim 0 over a and last dim over b",
                           with_layout(0, _split(mesh, args[0], {0: ("a",), len(shape) - 1: ("b",)}))))
    if shape and shape[0] % 4 == 0:
        out.append(Variant("input 0 split on dim 0 over a and b", with_layout(0, _split(mesh, args[0], {0: ("a", "b")}))))
    if args and case.partial and args[0].kind != "bool":
        split = {0: ("a",)} if shape and shape[0] % 2 == 0 else {}
        out.append(Variant("input 0 Partial(sum) over b" + (", dim 0 split over a" if split else ""),
                           with_layout(0, _split(mesh, args[0], split, partial={"b": "sum"}))))
    if len(args) > 1:  # a plain tensor first, the DTensor later (MindSpore dispatches on the plain one)
        last = args[-1]
        layouts = [None] * (len(args) - 1)
        even = last.shape and last.shape[0] % 2 == 0
        layouts.append(_split(mesh, last, {0: ("a",)}) if even else replicated[-1])
        out.append(Variant("plain tensors, last input a DTensor", tuple(layouts)))
    if len(out) > 1:
        out.pop(0)  # every other variant also passes through the dispatcher
    return out


def _split(mesh: Layout, arg: Arg, dims: Dict[int, Tuple[str, ...]], partial=None) -> TensorLayout:
    tensor_map = [dims.get(d) for d in range(len(arg.shape))]
    return TensorLayout(mesh, tensor_map, partial)


# -- running --------------------------------------------------------------------------------------

def run_case(case: OpCase, mesh: Layout = MESH) -> CaseResult:
    """Run `case` on one device and in every variant; see `CaseResult`.

    Raises:
        RuntimeError: the single-device reference itself fails (the case is not valid here).
    """
    inputs = make_inputs(case)
    try:
        reference = _leaves(case.reference(*inputs) if case.reference is not None else case.fn(*inputs))
        for leaf in reference:  # kernels run asynchronously: make a failing one fail here
            if isinstance(leaf, Tensor):
                leaf.asnumpy()
    except Exception as error:
        raise RuntimeError(f"op case {case.name!r}: the single-device reference fails: {error}") from error
    result = CaseResult(case)
    dispatched, fallbacks = set(), set()
    for variant in variants(case, mesh):
        accounting = Accounting(mesh.size)
        with use_accounting(accounting):
            operands = [x if layout is None else distribute_tensor(x, layout)
                        for x, layout in zip(make_inputs(case), variant.layouts)]
            try:
                got = _leaves(case.fn(*operands))
            except DTensorOpError as error:
                names = set(accounting.ops) | {error.op_name}
                if not any(name in str(error) for name in names):
                    result.unclear[variant.label] = f"error does not name the op: {error}"
                elif result.refusal is None:
                    result.refusal = str(error).splitlines()[0]
                dispatched |= set(accounting.ops)
                continue
            except Exception as error:  # anything else is not a clear refusal
                result.unclear[variant.label] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                continue
        dispatched |= set(accounting.ops)
        fallbacks |= set(accounting.fallbacks)
        problem = _compare(case, reference, got, operands)
        if problem:
            result.mismatches[variant.label] = problem
    result.dispatched = sorted(dispatched)
    result.fallbacks = sorted(fallbacks)
    return result


def _global_value(value: Tensor) -> np.ndarray:
    """A DTensor's global value assembled in numpy from its shards (checking that they cover it
    and that replicas agree); a plain Tensor's own value."""
    if not isinstance(value, DTensor):
        return value.asnumpy()
    layout = value.layout
    axes = significant_axes(layout)
    local = {key: shard.asnumpy() for key, shard in value.shards.items()}
    shards = {rank: local[key_of(layout.mesh.coords(rank), axes)] for rank in layout.mesh.ranks}
    return reference_executor.gather(shards, layout, value.global_shape)


def _leaves(value) -> List[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _compare(case: OpCase, reference: List[Any], got: List[Any], operands) -> str:
    if len(reference) != len(got):
        return f"{len(got)} outputs, expected {len(reference)}"
    for k, (r, g) in enumerate(zip(reference, got)):
        if isinstance(r, Tensor):
            if not isinstance(g, Tensor):
                return f"output {k} is {type(g).__name__}, expected a Tensor"
            try:
                r_np, g_np = r.asnumpy(), _global_value(g)
            except AssertionError as error:
                return f"output {k}: the shards do not form a tensor: {error}"
            if r_np.shape != g_np.shape or r.dtype != g.dtype:
                return f"output {k}: {g_np.shape} {g.dtype}, expected {r_np.shape} {r.dtype}"
            if case.check is not None:
                problem = case.check(r_np, g_np)
                if problem:
                    return f"output {k}: {problem}"
                continue
            if r_np.dtype.kind in "fc":
                if not np.allclose(g_np, r_np, rtol=RTOL, atol=ATOL, equal_nan=True):
                    return f"output {k}: max abs difference {np.nanmax(np.abs(g_np - r_np)):.3g}"
            elif not np.array_equal(g_np, r_np):
                return f"output {k}: {int(np.sum(g_np != r_np))} of {g_np.size} elements differ"
        elif r != g and not (isinstance(r, float) and np.isnan(r) and np.isnan(g)):
            return f"output {k}: {g!r}, expected {r!r}"
    return ""


# -- the table ------------------------------------------------------------------------------------

def run_all(cases: Sequence[OpCase] = CATALOG) -> List[CaseResult]:
    return [run_case(case) for case in cases]


def render(results: Sequence[CaseResult]) -> str:
    """docs/op_coverage.md for `results`."""
    kinds = ("rule", "rule + replicated", "replicated", "no dispatch", "refused")
    counts = {h: sum(1 for r in results if r.handling == h) for h in kinds}
    lines = [
        "# Op coverage of DTensors",
        "",
        "Generated by `python -m mindspore_hyper.tools.coverage.op_sweep` (do not edit; "
        "`tests/dtensor/test_op_sweep.py` fails when it is stale).",
        "",
        f"{len(results)} calls of `mindspore.ops`, `mindspore.mint`, `nn` functions, Tensor methods and Python "
        f"operators that run on CPU, each on random inputs laid out on a {'x'.join(map(str, MESH.device_matrix))} "
        "mesh in every variant: each input split along each of its dimensions, the first input split over both "
        "mesh axes and along two dimensions, a Partial(sum) first input, and plain tensors with a DTensor last. "
        "Every variant is compared with the same call on plain tensors on one device: forward values, shapes and "
        "dtypes (random ops by the properties of what they draw; in-place ops by the documented in-place result). "
        "Every call matches in every variant or is refused with an error naming the op; none gives a wrong value. "
        "Gradients of the rule families are checked in `tests/dtensor/test_sim_rules.py`.",
        "",
        "Handling: **rule** — every MindSpore op the call dispatches has a sharding rule (runs on the shards, "
        "moving only what the rule needs); **replicated** — the dispatched op has no rule for these inputs and "
        "runs once on gathered (replicated) inputs: correct, unsharded, counted in `report().fallbacks`; "
        "**rule + replicated** — rules for some of its ops or variants only; **no dispatch** — the call reads "
        "only the input's shape and dtype, or its gathered value (`Tensor(d)`); **refused** — raises "
        "`DTensorOpError` naming the op.",
        "",
        "Totals: " + ", ".join(f"{counts[h]} {h}" for h in kinds) + ".",
        "",
        "| op | dispatched MindSpore ops | handling | replicated fallback for | note |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        note = r.case.note
        if r.refusal is not None:
            note = (note + "; " if note else "") + r.refusal.replace("|", "/")
        lines.append(f"| `{r.case.name}` | {', '.join(r.dispatched) or '-'} | {r.handling} | "
                     f"{', '.join(r.fallbacks) or '-'} | {note or ''} |")
    return "\n".join(lines) + "\n"


def ops_section(document: str) -> str:
    """The part of docs/op_coverage.md that `render` writes (before the layer zoo)."""
    return document.split("\n" + LAYER_SECTION)[0]


def layers_section(document: str) -> str:
    """The layer-zoo part of docs/op_coverage.md (written by
    `python -m mindspore_hyper.tools.coverage.layer_sweep --write`), with the blank line
    before it; "" if there is none."""
    _, found, rest = document.partition("\n" + LAYER_SECTION)
    return "\n" + LAYER_SECTION + rest if found else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write (or with --check, verify) the coverage table, or with --json write the outcomes;
    returns the exit status (1 if an op is not ok or the table is stale)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parents[3] / "docs" / "op_coverage.md")
    parser.add_argument("--check", action="store_true", help="compare with the table instead of writing it")
    parser.add_argument("--json", type=Path, help="write each op's outcome to this JSON file instead")
    args = parser.parse_args(argv)
    # Thousands of tiny kernels: synchronous launches, set before the process runs its first
    # kernel, are ~10x faster than MindSpore's asynchronous pipeline here (same results).
    ms.set_context(pynative_synchronize=True)
    results = run_all()
    bad = [r for r in results if not r.ok]
    for r in bad:
        print(f"{r.case.name}: {r.mismatches or r.unclear}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_dict() for r in results], indent=1))
        return 1 if bad else 0
    current = args.output.read_text() if args.output.exists() else ""
    text = render(results) + layers_section(current)
    if args.check:
        if current != text:
            print(f"{args.output} is stale; run python -m mindspore_hyper.tools.coverage.op_sweep", file=sys.stderr)
            return 1
        return 1 if bad else 0
    args.output.write_text(text)
    print(f"wrote {args.output}: {len(results)} ops, {len(bad)} not ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
