"""Where the hidden state is in each block call of a traced chain (traced_chain.py).

A converted transformers layer is not always `block(hidden, *side) -> hidden`: it may take the mask
first (a hybrid model's second kind of layer is called `(mask, hidden)`) and return a tuple
(`(hidden_states, attentions)`, None, a cache, a constant), of which the model's loop keeps one
element. `HiddenRoute` records, from one recorded forward, which argument of each block is its hidden
input and which element of a tuple output is its hidden output, so a stage can feed the received
activation in at that argument and send that element on; a skipped block returns its recorded tuple
with the hidden state in its place (traced_chain.py checks the other elements are unused).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

from mindspore import Tensor

__all__ = ["HiddenRoute"]


@dataclass
class HiddenRoute:
    """The hidden state's place in each block's call.

    Attributes:
        hidden_args: per block, the position of its hidden input among its positional arguments.
        tuple_outputs: per block returning a tuple, (the hidden state's index in it, the recorded tuple).
    """

    hidden_args: List[int]
    tuple_outputs: Dict[int, Tuple[int, tuple]]

    def hidden_of(self, i: int, out):
        """The hidden state in block i's output (the output itself unless the block returns a tuple)."""
        return out[self.tuple_outputs[i][0]] if i in self.tuple_outputs else out

    def block_output(self, i: int, hidden):
        """What block i returns with `hidden` as its hidden state: `hidden`, or for a block returning a
        tuple the recorded tuple with `hidden` in its place."""
        if i not in self.tuple_outputs:
            return hidden
        index, recorded = self.tuple_outputs[i]
        return type(recorded)(hidden if k == index else v for k, v in enumerate(recorded))

    @classmethod
    def of_calls(cls, where: str, calls: Sequence[tuple], num_blocks: int) -> "HiddenRoute":
        """The route of a recorded forward's block calls (index, args, kwargs, output).

        Args:
            where: the CellList's name, for messages ("GPT.blocks").
            calls: the block calls in the order they ran.
            num_blocks: the CellList's length.

        Raises:
            ValueError: naming the first call that breaks the chain: a block run twice or out of
                order, one not taking the previous block's hidden state, an output that is neither a
                Tensor nor a tuple holding one, a block never called.
        """
        route = cls([], {})
        order = [i for i, _, _, _ in calls]
        repeated = next((i for i in order if order.count(i) > 1), None)
        if repeated is not None:
            raise ValueError(f"pipeline: {where} is not a chain: block {repeated} is called {order.count(repeated)} "
                             f"times (the construct runs its blocks more than once, e.g. a recurrent-depth loop); "
                             f"every block runs once, in order")
        for k, (i, args, _, out) in enumerate(calls):
            if i != k:
                raise ValueError(f"pipeline: {where} is not a chain: call {k} of its blocks is block {i} (expected "
                                 f"block {k}; every block runs once, in order)")
            if k == 0:
                route.hidden_args.append(_first_hidden_arg(where, calls))
            else:
                previous = route.hidden_of(k - 1, calls[k - 1][3])
                found = [a for a, v in enumerate(args) if v is previous]
                if not found:
                    raise ValueError(f"pipeline: {where} is not a chain: no argument of block {i} is block {i - 1}'s "
                                     f"output (code between blocks, or another tensor); only the hidden state passes "
                                     f"between stages")
                route.hidden_args.append(found[0])
            if isinstance(out, (tuple, list)):
                route.tuple_outputs[i] = (route._hidden_index(where, calls, k), out)
            elif not isinstance(out, Tensor):
                raise ValueError(f"pipeline: {where}[{i}] returns a {type(out).__name__}, expected one Tensor or a "
                                 f"tuple holding it (the hidden state sent to the next stage)")
        if not calls:
            raise ValueError(f"pipeline: {where} is not a chain: the construct never calls its blocks as Cells (a "
                             f"flattened construct, e.g. a converted model's, that uses their parameters directly "
                             f"cannot be cut; give the chain with pipeline_layers())")
        if len(calls) != num_blocks:
            raise ValueError(f"pipeline: {where} is not a chain: the construct called {len(calls)} of its "
                             f"{num_blocks} blocks (every block runs once, in order)")
        return route

    def _hidden_index(self, where: str, calls, k: int) -> int:
        """Which element of block k's tuple is the hidden state: the one the next block takes as an
        argument; for the last block the index the block before used (same tuple length)."""
        out = calls[k][3]
        if k + 1 < len(calls):
            found = [j for j, v in enumerate(out) if isinstance(v, Tensor) and any(v is a for a in calls[k + 1][1])]
            if found:
                return found[0]
            raise ValueError(f"pipeline: {where} is not a chain: no argument of block {k + 1} is an element of "
                             f"the tuple block {k} returns (code between blocks, or another tensor); only the "
                             f"hidden state passes between stages")
        before = self.tuple_outputs.get(k - 1)
        if before is not None and len(before[1]) == len(out) and isinstance(out[before[0]], Tensor):
            return before[0]
        raise ValueError(f"pipeline: {where}[{k}] (the last block) returns a tuple of {len(out)} but the block "
                         f"before does not return one of the same length, so which element is the hidden state "
                         f"the code after the blocks uses is unknown")


def _first_hidden_arg(where: str, calls) -> int:
    """The position of block 0's hidden input: its first argument when that is a Tensor of the shape of
    the Tensors block 1 takes from block 0, else its only Tensor argument of that shape (a converted
    layer may take the mask first). A wrong pick cannot pass silently: the real hidden input would be
    a side input depending on parameters (the embedding), which _check_side_inputs refuses."""
    args, out = calls[0][1], calls[0][3]
    outputs = [v for v in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(v, Tensor)]
    taken = [v for v in outputs if len(calls) > 1 and any(v is a for a in calls[1][1])]
    shape = (taken or outputs or [None])[0]
    shape = shape.shape if shape is not None else None
    same = [a for a, v in enumerate(args) if isinstance(v, Tensor) and v.shape == shape]
    if 0 in same or (not same and args and isinstance(args[0], Tensor)):
        return 0
    if len(same) == 1:
        return same[0]
    raise ValueError(f"pipeline: {where}[0] takes {len(same)} Tensors of its output's shape {shape} (arguments "
                     f"{same}) and its first argument is not one, so which one is the hidden state the stages "
                     f"send to each other is unknown")
