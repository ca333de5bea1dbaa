"""The conversion report: tracer, every mapping used, constants, rewrites, weights, output check."""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mindspore_hyper.migrate.codegen import MappingUse
from mindspore_hyper.migrate.state_dict import StateDictReport

__all__ = ["ConversionReport"]


@dataclass
class ConversionReport:
    """What convert() did.

    Attributes:
        model: the torch class converted.
        tracer: "torch.fx" or "torch.export".
        uses: one MappingUse per converted op (torch op, MindSpore API, node, location).
        unsupported: one line per op that could not be converted (empty when conversion succeeded).
        notes: tracing facts (specialised shapes, why fx was not used).
        folded: constants computed at conversion time.
        rewritten: in-place ops made out-of-place.
        weights: the state-dict placement report.
        outputs: output names, in the order the Cell returns them.
        check: the output comparison with torch on the example inputs (or why it was not run).
        files: paths written with `out=`.
        seconds: conversion time (s).
        classes: (structure="modules") one row per generated class: its name, the torch class,
            how many modules share it, the first one's path, its __init__ hyper-parameters, lines.
        layers: (structure="modules") module path -> the MindSpore layer it maps to.
        loops: (structure="modules") CellList paths whose per-layer calls are a loop in construct.
        symbolic: input name -> per-dimension symbol (None: static); with structure="flat", torch.fx keeps
            every dimension symbolic (read at run time) and torch.export none.
        static: input dimensions the Cell is specialised to, with their size.
        source_lines: lines of the generated source file.
        fallbacks: (structure="modules") one row per module written as its traced body because its class
            could not be generated: {"module": path, "torch": class, "reason": why}.
        custom_backward: torch.autograd.Function class with its own backward that the forward ran -> the
            gradient check's result (custom_backward.py); empty when none ran.
        other_mode: the Cell against torch in the train/eval mode torch was not traced in (mode_check.py):
            {"mode", "status": "equal"|"differs"|"not checked", "max_relative_error", "tolerance", "reason",
            "refused": the Cell's message when it raises in that mode}; empty before the check.
    """

    model: str
    tracer: str = ""
    uses: List[MappingUse] = field(default_factory=list)
    unsupported: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    folded: List[str] = field(default_factory=list)
    rewritten: List[str] = field(default_factory=list)
    weights: Optional[StateDictReport] = None
    outputs: List[str] = field(default_factory=list)
    check: Dict[str, Any] = field(default_factory=dict)
    files: Dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    classes: List[Dict[str, Any]] = field(default_factory=list)
    layers: Dict[str, str] = field(default_factory=dict)
    loops: List[str] = field(default_factory=list)
    symbolic: Dict[str, List[Optional[str]]] = field(default_factory=dict)
    static: List[str] = field(default_factory=list)
    source_lines: int = 0
    fallbacks: List[Dict[str, str]] = field(default_factory=list)
    custom_backward: Dict[str, str] = field(default_factory=dict)
    other_mode: Dict[str, Any] = field(default_factory=dict)

    def mapping_table(self) -> List[Dict[str, Any]]:
        """One row per (torch op, MindSpore API): count and first location."""
        rows: "OrderedDict[tuple, Dict[str, Any]]" = OrderedDict()
        for use in self.uses:
            row = rows.setdefault((use.torch_op, use.mindspore), {"torch": use.torch_op, "mindspore": use.mindspore,
                                                                   "count": 0, "first": use.where})
            row["count"] += 1
        return list(rows.values())

    def to_dict(self) -> dict:
        return {"model": self.model, "tracer": self.tracer, "mappings": self.mapping_table(),
                "unsupported": list(self.unsupported), "notes": list(self.notes), "folded": list(self.folded),
                "rewritten": list(self.rewritten), "weights": self.weights.to_dict() if self.weights else None,
                "outputs": list(self.outputs), "check": dict(self.check), "files": dict(self.files),
                "seconds": self.seconds, "classes": list(self.classes), "layers": dict(self.layers),
                "loops": list(self.loops), "symbolic": dict(self.symbolic), "static": list(self.static),
                "source_lines": self.source_lines, "fallbacks": list(self.fallbacks),
                "custom_backward": dict(self.custom_backward), "other_mode": dict(self.other_mode)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def __str__(self) -> str:
        """A readable summary: what was converted, each input's symbolic and fixed dimensions (by
        input name and dimension), the classes, fallbacks, mappings, the check and the files
        written (every figure is in `to_dict()` / the .report.json too)."""
        lines = [f"converted {self.model}: {len(self.uses)} ops, traced with {self.tracer}, in {self.seconds:.2f} s"]
        lines += [f"  note: {n}" for n in self.notes]
        lines += self._input_lines()
        if self.classes:
            lines.append("generated classes (MindSpore class <- torch class):")
            lines += [f"  {c['class']} <- {c['torch']} ({_modules(c)}"
                      + (f"; __init__({', '.join(c['hyperparameters'])})" if c["hyperparameters"] else "") + ")"
                      for c in self.classes]
            lines.append("fallbacks (modules written as their traced body, their class could not be generated): "
                         + ("none" if not self.fallbacks else str(len(self.fallbacks))))
            lines += [f"  {f['module'] or '(root)'} ({f['torch']}): {f['reason']}" for f in self.fallbacks]
        if self.loops:
            lines.append("loops over CellLists: " + ", ".join(self.loops))
        table = self.mapping_table()
        if table:
            width = max(len(r["torch"]) for r in table)
            lines.append("ops converted (torch -> MindSpore, count):")
            lines += [f"  {r['torch']:<{width}}  -> {r['mindspore']}  x{r['count']}" for r in table]
        if self.unsupported:
            lines.append("unsupported:")
            lines += [f"  {u}" for u in self.unsupported]
        if self.folded:
            lines.append(f"constants computed at conversion time: {len(self.folded)}")
            lines += [f"  {f}" for f in self.folded]
        if self.rewritten:
            lines.append("in-place ops rewritten:")
            lines += [f"  {r}" for r in self.rewritten]
        if self.weights is not None:
            lines.append("weights: " + str(self.weights).replace("\n", "\n  "))
        if self.outputs:
            lines.append("outputs: " + ", ".join(self.outputs))
        if self.custom_backward:
            lines.append("torch.autograd.Functions with their own backward (the Cell differentiates their forward):")
            lines += [f"  {name}: {result}" for name, result in self.custom_backward.items()]
        if self.check:
            lines.append("check against torch: " + "; ".join(_check_text(k, v) for k, v in self.check.items()))
        if self.other_mode:
            lines.append(_other_mode_text(self.other_mode))
        if self.files:
            lines.append("files written:")
            lines += [f"  {path}  ({_FILE_KINDS.get(kind, kind)})" for kind, path in self.files.items()]
        return "\n".join(lines)

    def _input_lines(self) -> List[str]:
        """One line per input: each dimension symbolic (its size may change between calls; "= x
        dim 0" where two dimensions share a symbol, so must be equal) or fixed at its traced size."""
        first: Dict[str, str] = {}  # symbol -> the first "input dim d" holding it
        fixed = {text.rsplit(" = ", 1)[0]: text.rsplit(" = ", 1)[1] for text in self.static}
        lines = []
        for name, dims in self.symbolic.items():
            parts = []
            for d, symbol in enumerate(dims):
                where = f"{name} dim {d}"
                if symbol is None:
                    size = fixed.get(f"{name} dimension {d}")
                    parts.append(f"dim {d} fixed" + (f" at {size}" if size is not None else ""))
                elif symbol in first:
                    parts.append(f"dim {d} symbolic (= {first[symbol]})")
                else:
                    first[symbol] = where
                    parts.append(f"dim {d} symbolic (may change between calls)")
            lines.append(f"input {name}: " + (", ".join(parts) if parts else "a scalar"))
        return lines


_FILE_KINDS = {"source": "MindSpore source: the Cell classes and build(checkpoint)", "checkpoint": "the weights",
               "report": "this report in full, JSON"}


def _modules(row: Dict[str, Any]) -> str:
    """How many torch modules a generated class stands for, and the first one's path."""
    first = repr(row["first"]) if row["first"] else "the root"
    return f"1 module: {first}" if row["modules"] == 1 else f"{row['modules']} modules, first {first}"


def _check_text(key: str, value: Any) -> str:
    """One check against torch in words: the example inputs' ("max_relative_error"), or a second
    shape's ("second_shape": its shapes and result); skipped or failed ones say why."""
    if key == "max_relative_error":
        return f"max relative error {value:.2g} on the example inputs"
    if isinstance(value, dict):
        shapes = " and ".join(str(tuple(shape)) for shape in value.get("shapes", []))
        on = f" on inputs of shape {shapes}" if shapes else f" ({key})"
        if "max_relative_error" in value:
            return f"max relative error {value['max_relative_error']:.2g}{on}"
        return f"{'failed' if 'failed' in value else 'skipped'}{on}: {value.get('failed') or value.get('skipped')}"
    return f"{key.replace('_', ' ')}: {value}"


def _other_mode_text(result: Dict[str, Any]) -> str:
    """The other train/eval mode's check in words: "eval mode checked: equal", not checked (why), or not
    supported by this conversion (why, and what the Cell says when run in it)."""
    mode = result["mode"]
    if result["status"] == "equal":
        return f"{mode} mode checked: equal (max relative error {result['max_relative_error']:.2g})"
    if result["status"] == "not checked":
        return f"{mode} mode not checked: {result['reason']}"
    return (f"{mode} mode NOT SUPPORTED by this conversion ({result['reason']}); the Cell raises when run in it: "
            f"{result.get('refused', '')}")
