"""torch.einsum -> the `einsum` helper (generated_support.py): sums, transposes and batched matrix products.

MindSpore's einsum has no CPU kernel. At conversion time the equation is made explicit for the operands'
ranks (which torch.export fixes): the ellipsis becomes letters (right-aligned across operands, as torch
broadcasts it) and an implicit output is written out (the ellipsis, then the letters used once, in the
order torch sorts them: upper case before lower case). The helper then needs no parsing beyond letters.
A letter repeated within one operand (a diagonal, `ii->i`) is refused by name.
"""
from __future__ import annotations

import string
from typing import List, Sequence

import torch

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import Arg, Unsupported, function

__all__ = ["explicit_equation"]

aten = torch.ops.aten

_LETTERS = string.ascii_uppercase + string.ascii_lowercase  # torch's label order


def _split_term(term: str, equation: str) -> List[str]:
    """The labels of one term: letters, and "..." once at most."""
    labels, rest = [], term
    while rest:
        if rest.startswith("..."):
            if "..." in labels:
                raise Unsupported(f"einsum equation {equation!r}: more than one ellipsis in {term!r}")
            labels.append("...")
            rest = rest[3:]
        elif rest[0] in _LETTERS:
            labels.append(rest[0])
            rest = rest[1:]
        else:
            raise Unsupported(f"einsum equation {equation!r}: {rest[0]!r} is not a letter or '...'")
    return labels


def explicit_equation(equation: str, ndims: Sequence[int]) -> str:
    """`equation` with its ellipsis written as letters and its output given, for operands of ranks `ndims`.

    Args:
        equation: a torch.einsum equation (spaces allowed, output optional).
        ndims: the rank of each operand.

    Returns:
        An equation of letters only, with `->`, and no letter twice in one operand.

    Raises:
        Unsupported: the equation does not fit the operands, or repeats a letter within one operand or the output.
    """
    text = equation.replace(" ", "")
    inputs, arrow, output = text.partition("->")
    terms = [_split_term(t, equation) for t in inputs.split(",")]
    if len(terms) != len(ndims):
        raise Unsupported(f"einsum equation {equation!r} has {len(terms)} operands, the call {len(ndims)}")
    used = {c for t in terms for c in t if c != "..."}
    if arrow:
        used |= {c for c in _split_term(output, equation) if c != "..."}
    spare = [c for c in _LETTERS if c not in used]
    widths = []
    for term, ndim in zip(terms, ndims):
        width = ndim - (len(term) - ("..." in term))
        if width < 0 or width and "..." not in term:
            raise Unsupported(f"einsum equation {equation!r}: term {''.join(term)!r} does not fit an operand of "
                              f"rank {ndim}")
        widths.append(width)
    ellipsis = "".join(spare[:max(widths, default=0)])
    written = []
    for term, width in zip(terms, widths):
        letters = "".join(ellipsis[len(ellipsis) - width:] if c == "..." else c for c in term)
        repeated = sorted({c for c in letters if letters.count(c) > 1})
        if repeated:
            raise Unsupported(f"einsum equation {equation!r}: letter {repeated[0]!r} appears twice in one operand "
                              f"(a diagonal), which is not mapped")
        written.append(letters)
    if arrow:
        out = "".join(ellipsis if c == "..." else c for c in _split_term(output, equation))
        if len(set(out)) != len(out) or any(c not in "".join(written) for c in out):
            raise Unsupported(f"einsum equation {equation!r}: the output repeats a letter or has one no operand has")
    else:
        counts = "".join(written)
        out = ellipsis + "".join(c for c in _LETTERS if c not in ellipsis and counts.count(c) == 1)
    return ",".join(written) + "->" + out


def _operands(operands: Sequence[Arg], tensors: Arg) -> List[Arg]:
    if tensors is not None and tensors.value is not None:
        return list(tensors.items) if tensors.items is not None else [tensors]
    if len(operands) == 1 and operands[0].items is not None:  # torch.einsum(eq, [a, b])
        return list(operands[0].items)
    return list(operands)


@function("einsum (helper)", aten.einsum, torch.einsum)
def einsum(equation, *operands, tensors=None, path=None):
    # `path` (a contraction order) changes only the order of the float sums: the helper contracts left to right.
    found = _operands(operands, tensors)
    if not all(t.is_tensor for t in found):
        raise Unsupported("einsum operands must be tensors")
    explicit = explicit_equation(equation.const("equation"), [t.ndim for t in found])
    return call("einsum", repr(explicit), *found)
