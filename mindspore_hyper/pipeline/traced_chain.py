"""Pipeline stages of a model whose construct loops over an nn.CellList (embed -> blocks -> head).

Typical models are not one chain of Cells: a construct computes an embedding, calls each block
of an nn.CellList with the hidden state and side inputs (attention mask, position ids), then a
norm, a head and the loss. `TracedChain` pipelines such a model without rewriting it:

- the layers are the blocks of the model's longest CellList that is not inside another's blocks;
  of several as long, the trace keeps the one the forward calls; stage s runs blocks [start, end);
- a stage runs the model's own construct on the microbatch's inputs with the blocks patched for
  the call: blocks before the stage pass their hidden input through, the stage's first block
  takes the activation received from the previous stage instead, and after the stage's last
  block the call stops (the rest is the next stages'). So the prologue (code before the first
  block: embedding, mask, positions) runs on every stage: its side inputs are recomputed per
  stage rather than sent; its hidden output is used on stage 0 only. The epilogue (norm, head,
  loss) runs on the last stage, whose output is the model's output (a scalar loss in training);
- one forward is recorded on the first microbatch (`trace`) and checked: every block is called
  once, in order, taking the previous block's hidden state as one of its arguments and returning
  one Tensor, or a tuple holding it (hidden_route.py says where it is in each call). The tuple's
  other elements (attention weights, None, a cache) must be unused: a forward with each of their
  Tensors perturbed gives the same model output, so a block skipped on a stage may return them as
  recorded. Side inputs do not depend on parameters or random ops (they are compared after
  perturbing every parameter), since stages after the first recompute them with parameters they
  do not train. The first failed check raises a ValueError naming the call.
- Parameters outside the blocks are given to the stages by perturbation: those the first
  block's input depends on train on stage 0, those the output depends on after the last block
  on the last stage (a tied embedding / head weight trains on both, its gradients summed). The
  trace runs forwards only, so it also works inside an outer `mindspore.grad`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List, Sequence, Set, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.pipeline.hidden_route import HiddenRoute

__all__ = ["TracedChain", "TracedStageCell", "block_list_candidates"]


class _StageEnd(Exception):
    """Raised after a stage's last block to stop the model's construct there (carries the output)."""

    def __init__(self, output):
        super().__init__("pipeline stage end")
        self.output = output


def block_list_candidates(model: nn.Cell) -> List[Tuple[str, nn.CellList]]:
    """The model's outermost nn.CellLists (not inside another one's blocks) of at least 2 Cells that tie for
    the most Cells, with their paths, in model order; empty if there is none. Several candidates (a vision
    tower's and a language model's layers) are told apart by the trace: the chain is the one the forward calls."""
    found = [(name, cell) for name, cell in model.cells_and_names() if isinstance(cell, nn.CellList) and len(cell) >= 2]
    found = [(name, cell) for name, cell in found if not any(name.startswith(other + ".") for other, _ in found)]
    most = max((len(cell) for _, cell in found), default=0)
    return [(name, cell) for name, cell in found if len(cell) == most]


class TracedChain:
    """A model's CellList of blocks as the pipeline's layers (see module docstring).

    Args:
        model: the user's model.
        path: the CellList's name in the model.
        blocks: the CellList.
        alternatives: other (path, CellList) of as many Cells that may be the chain instead (see
            block_list_candidates); the trace keeps the one the forward calls.
    """

    def __init__(self, model: nn.Cell, path: str, blocks: nn.CellList,
                 alternatives: Sequence[Tuple[str, nn.CellList]] = ()):
        self.model = model
        self.candidates = [(path, blocks)] + list(alternatives)
        self._select(path, blocks)
        self.traced = False
        self.prologue_params: Tuple[Parameter, ...] = ()
        self.epilogue_params: Tuple[Parameter, ...] = ()
        self.prologue_cells: Tuple[nn.Cell, ...] = ()
        self.epilogue_cells: Tuple[nn.Cell, ...] = ()
        self.route = HiddenRoute([], {})  # where the hidden state is in each block's call (set by the trace)

    def _select(self, path: str, blocks: nn.CellList) -> None:
        """Make `blocks` (at `path`) the chain."""
        self.path, self.blocks = path, list(blocks)
        in_blocks = {id(p) for b in self.blocks for p in b.get_parameters()}
        self.outer_params: Tuple[Parameter, ...] = tuple(p for p in self.model.trainable_params()
                                                         if id(p) not in in_blocks)

    def _pick_candidate(self, inputs) -> None:
        """Of several candidate CellLists, keep the one whose blocks the forward on `inputs` calls.

        Raises:
            ValueError: none or several of them are called (naming them).
        """
        counts = {path: 0 for path, _ in self.candidates}

        def counter(path):
            def hook(_cell, _inputs):
                counts[path] += 1
            return hook
        handles = [b.register_forward_pre_hook(counter(path)) for path, blocks in self.candidates for b in blocks]
        try:
            self.model(*inputs)
        finally:
            for handle in handles:
                handle.remove()
        called = [(path, blocks) for path, blocks in self.candidates if counts[path]]
        if len(called) != 1:
            listed = ", ".join(f"{path!r} ({counts[path]} block calls)" for path, _ in self.candidates)
            raise ValueError(f"pipeline: {type(self.model).__name__} has several nn.CellLists of "
                             f"{len(self.blocks)} Cells and the forward calls {len(called)} of them: {listed}; "
                             f"which one is the chain is ambiguous: give the chain with pipeline_layers()")
        self._select(*called[0])
        self.candidates = called

    # -- running a stage --------------------------------------------------------------------------
    @contextmanager
    def stage_calls(self, start: int, end: int, received, stop: bool) -> Iterator[None]:
        """Blocks patched for one stage's run of the model's construct: blocks < start pass their
        input through, block `start` takes `received` (unless None) as its hidden input, block
        end-1 raises _StageEnd with its output when `stop`."""
        def patched(i, block):
            construct = type(block).construct

            def call(*args, **kw):
                pos = self.route.hidden_args[i]
                if i < start:
                    return self.route.block_output(i, args[pos])
                if i == start and received is not None:
                    args = args[:pos] + (received,) + args[pos + 1:]
                out = construct(block, *args, **kw)
                if stop and i == end - 1:
                    raise _StageEnd(self.route.hidden_of(i, out))
                return out
            return call

        with self._patched(patched):
            yield

    def run_stage(self, start: int, end: int, received, inputs: Sequence, last: bool):
        """The stage's output: the activation after block end-1, or on the last stage the model's output."""
        with self.stage_calls(start, end, received, stop=not last):
            try:
                return self.model(*inputs)
            except _StageEnd as done:
                return done.output

    @contextmanager
    def _patched(self, make) -> Iterator[None]:
        for i, block in enumerate(self.blocks):
            object.__setattr__(block, "construct", make(i, block))  # an instance attribute: Cell.__call__ uses it
        try:
            yield
        finally:
            for block in self.blocks:
                object.__delattr__(block, "construct")

    # -- the recorded forward -------------------------------------------------------------------------
    def trace(self, inputs: Sequence, require_loss: bool) -> None:
        """Record one forward on `inputs` (a microbatch), check it is a chain, and give the
        parameters outside the blocks to the first / last stage (see module docstring).

        Args:
            inputs: the model's inputs for one microbatch.
            require_loss: the model's output must be a scalar (training).

        Raises:
            ValueError: naming the first call that breaks the chain, the tuple element besides the
                hidden state that is used after its block, or the side input that depends on
                parameters or random ops; a non-scalar output with `require_loss`.
        """
        if len(self.candidates) > 1:
            self._pick_candidate(inputs)
        calls, phases, out = self._record(inputs)
        if require_loss and not (isinstance(out, Tensor) and out.ndim == 0):
            raise ValueError(f"pipeline: {type(self.model).__name__}'s construct returns "
                             f"{getattr(out, 'shape', type(out).__name__)}, expected a scalar loss (a pipeline "
                             f"trains on the loss its last stage returns; pass the labels as inputs)")
        self.route = HiddenRoute.of_calls(f"{type(self.model).__name__}.{self.path}", calls, len(self.blocks))
        self._check_unused_elements(inputs, out)
        self._check_side_inputs(calls, inputs)
        self.prologue_cells = tuple(c for c, phase in phases.values() if phase == "before")
        self.epilogue_cells = tuple(c for c, phase in phases.values() if phase == "after")
        self.prologue_params, self.epilogue_params = self._outer_params_by_perturbation(inputs, calls)
        self.traced = True

    def _record(self, inputs) -> Tuple[List[tuple], Dict[int, tuple], object]:
        """The block calls (index, args, kwargs, output), per Cell outside the blocks whether it
        was called before the first block, after the last, or in between, and the model's output."""
        calls: List[tuple] = []
        phases: Dict[int, tuple] = {}
        block_ids = {id(c) for b in self.blocks for _, c in b.cells_and_names()}

        def patched(i, block):
            construct = type(block).construct

            def call(*args, **kw):
                out = construct(block, *args, **kw)
                calls.append((i, args, kw, out))
                return out
            return call

        def pre_hook(cell, _inputs):
            phase = "before" if not calls else ("after" if len(calls) >= len(self.blocks) else "between")
            previous = phases.get(id(cell), (cell, phase))[1]
            phases[id(cell)] = (cell, phase if previous == phase else "both")

        handles = [c.register_forward_pre_hook(pre_hook) for _, c in self.model.cells_and_names()
                   if c is not self.model and id(c) not in block_ids and not isinstance(c, nn.CellList)]
        try:
            with self._patched(patched):
                out = self.model(*inputs)
        finally:
            for handle in handles:
                handle.remove()
        return calls, phases, out

    def _check_unused_elements(self, inputs, out) -> None:
        """The elements of the blocks' tuples besides the hidden state must not reach the model's output
        (a skipped block returns them as recorded): a forward with every such Tensor perturbed must give
        `out`; else the forward is repeated per element to name the first one used."""
        others = [(i, j) for i, (index, recorded) in self.route.tuple_outputs.items()
                  for j, v in enumerate(recorded) if j != index and _has_tensor(v)]
        if not others:
            return
        if _same(self._output_perturbing(inputs, set(others)), out):
            return
        if not _same(self._output_perturbing(inputs, set()), out):
            raise ValueError(f"pipeline: {type(self.model).__name__}'s forward is random (dropout?) and its blocks "
                             f"return tuples, so whether the elements besides the hidden state are unused cannot be "
                             f"checked; set dropout to 0 or return the hidden state alone")
        for i, j in others:
            if not _same(self._output_perturbing(inputs, {(i, j)}), out):
                raise ValueError(f"pipeline: {type(self.model).__name__}.{self.path}[{i}] returns a tuple whose "
                                 f"element {j} is used after the block (by a later block or the code after the "
                                 f"blocks); only element {self.route.tuple_outputs[i][0]}, the hidden state, passes "
                                 f"between stages")
        raise ValueError(f"pipeline: {type(self.model).__name__}.{self.path}'s output changes when its blocks' tuple "
                         f"elements besides the hidden state are perturbed together (not one alone); only the "
                         f"hidden state passes between stages")

    def _output_perturbing(self, inputs, elements: Set[Tuple[int, int]]):
        """The model's output with the (block, element) Tensors of the blocks' tuples perturbed."""
        rng = np.random.default_rng(2)

        def perturbing(i, block):
            construct = type(block).construct

            def call(*args, **kw):
                out = construct(block, *args, **kw)
                if not any(b == i for b, _ in elements):
                    return out
                return type(out)(_perturbed(v, rng) if (i, j) in elements else v for j, v in enumerate(out))
            return call
        with self._patched(perturbing):
            return self.model(*inputs)

    def _check_side_inputs(self, calls, inputs) -> None:
        """Side inputs must be recomputable on every stage: the same values when every parameter
        changes (and the forward runs again, drawing new random numbers)."""
        first = [_side_values(args, kw, self.route.hidden_args[i]) for i, args, kw, _ in calls]
        if not any(first):
            return
        params = [p for p in self.model.trainable_params() if np.issubdtype(p.asnumpy().dtype, np.floating)]
        saved = [p.asnumpy().copy() for p in params]
        rng = np.random.default_rng(0)
        try:
            for p, value in zip(params, saved):
                noise = rng.standard_normal(value.shape).astype(value.dtype) * (np.abs(value).mean() + 0.1)
                ops.assign(p, Tensor(value + noise, dtype=p.dtype))
            again, _, _ = self._record(inputs)
        finally:
            for p, value in zip(params, saved):
                ops.assign(p, Tensor(value, dtype=p.dtype))
        for (i, args, kw, _), before, (_, args2, kw2, _) in zip(calls, first, again):
            after = _side_values(args2, kw2, self.route.hidden_args[i])
            for name, value in before.items():
                if name not in after or after[name].shape != value.shape or not np.array_equal(after[name], value):
                    raise ValueError(f"pipeline: {type(self.model).__name__}.{self.path}[{i}]'s side input {name} "
                                     f"depends on parameters or random ops; stages after the first recompute side "
                                     f"inputs from the model inputs, so they may only depend on those and constants")

    def _outer_params_by_perturbation(self, inputs, calls) -> Tuple[Tuple[Parameter, ...], Tuple[Parameter, ...]]:
        """Parameters outside the blocks that the first block's input depends on (prologue), and
        that the model's output depends on with the last block's output held fixed (epilogue):
        each is perturbed in turn and forwards are compared (forward only, so a trace may run
        inside an outer gradient). A dependence through random ops counts too, which only adds
        a stage that gets a zero gradient for it."""
        if not self.outer_params:
            return (), ()
        last_output = self.route.hidden_of(len(calls) - 1, calls[-1][3])
        x0, out = self._first_input(inputs), self._output_after(inputs, last_output)
        rng = np.random.default_rng(1)
        pro, epi = [], []
        for p in self.outer_params:
            value = p.asnumpy().copy()
            noise = rng.standard_normal(value.shape).astype(value.dtype) * (np.abs(value).mean() + 0.1)
            ops.assign(p, Tensor(value + noise, dtype=p.dtype))
            try:
                x0_changed = not np.array_equal(self._first_input(inputs), x0)
                out_changed = not np.array_equal(self._output_after(inputs, last_output), out)
            finally:
                ops.assign(p, Tensor(value, dtype=p.dtype))
            if x0_changed:
                pro.append(p)
            if out_changed or not x0_changed:
                epi.append(p)
        return tuple(pro), tuple(epi)

    def _first_input(self, inputs) -> np.ndarray:
        """The first block's hidden input (the construct stops there)."""
        def stop_at_first(i, block):
            def call(*args, **kw):
                raise _StageEnd(args[self.route.hidden_args[0]])
            return call
        with self._patched(stop_at_first):
            try:
                self.model(*inputs)
            except _StageEnd as done:
                return done.output.asnumpy()
        raise RuntimeError("pipeline: the traced construct did not call its first block")

    def _output_after(self, inputs, last_output) -> np.ndarray:
        """The model's output with the blocks skipped and the last one returning `last_output`."""
        def fixed(i, block):
            def call(*args, **kw):
                hidden = last_output if i == len(self.blocks) - 1 else args[self.route.hidden_args[i]]
                return self.route.block_output(i, hidden)
            return call
        with self._patched(fixed):
            out = self.model(*inputs)
        return out.asnumpy() if isinstance(out, Tensor) else np.asarray(out)

    def stage_parameters(self, start: int, end: int, last: bool) -> List[Parameter]:
        """The trainable Parameters stage [start, end) trains (blocks, plus outer ones on the ends)."""
        out: List[Parameter] = []
        seen: Set[int] = set()
        extra = list(self.prologue_params if start == 0 else ()) + list(self.epilogue_params if last else ())
        for p in [p for b in self.blocks[start:end] for p in b.trainable_params()] + extra:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out


def _has_tensor(value) -> bool:
    """Whether `value` is a Tensor or a tuple / list holding one (at any depth)."""
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(v) for v in value)
    return isinstance(value, Tensor)


def _perturbed(value, rng):
    """`value` with noise of its own scale added to every floating Tensor in it (others unchanged)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_perturbed(v, rng) for v in value)
    if not isinstance(value, Tensor) or not np.issubdtype(value.asnumpy().dtype, np.floating):
        return value
    array = value.asnumpy()
    noise = rng.standard_normal(array.shape).astype(array.dtype) * (np.abs(array).mean() + 0.1)
    return Tensor(array + noise, dtype=value.dtype)


def _same(a, b) -> bool:
    """Whether two model outputs (Tensors, or tuples of them) are equal."""
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b)
                and all(_same(x, y) for x, y in zip(a, b)))
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.shape == b.shape and np.array_equal(a.asnumpy(), b.asnumpy())
    return a is b or a == b


def _side_values(args, kw, hidden: int) -> Dict[str, np.ndarray]:
    """The Tensor side inputs of a block call (all but its hidden argument at position `hidden`), by position
    (counted from 0) / keyword."""
    out = {f"argument {k}": a.asnumpy() for k, a in enumerate(args) if k != hidden and isinstance(a, Tensor)}
    out.update({f"{name}=": a.asnumpy() for name, a in kw.items() if isinstance(a, Tensor)})
    return out


class TracedStageCell(nn.Cell):
    """Stage [start, end) of a TracedChain: `construct(x, *inputs)` runs the model's construct on
    the microbatch `inputs` with `x` (the previous stage's activation; ignored on stage 0) as the
    stage's hidden input. `parameters_and_names` yields the model's names of the stage's Parameters."""

    def __init__(self, chain: TracedChain, start: int, end: int, last: bool, param_names: Dict[int, str]):
        super().__init__(auto_prefix=False)
        self._chain, self._start, self._end, self._last = chain, start, end, last
        cells = list(chain.blocks[start:end])
        cells += list(chain.prologue_cells if start == 0 else ()) + list(chain.epilogue_cells if last else ())
        for i, cell in enumerate(cells):  # for cells_and_names (the stage's Dropouts), not called directly
            self.insert_child_to_cell(f"cell{i}", cell)
        self._stage_params = chain.stage_parameters(start, end, last)
        self._names = param_names

    def construct(self, x, *inputs):
        received = None if self._start == 0 else x
        return self._chain.run_stage(self._start, self._end, received, inputs, self._last)

    def trainable_params(self, recurse: bool = True) -> List[Parameter]:
        return list(self._stage_params)

    def parameters_and_names(self, name_prefix: str = "", expand: bool = True):
        for p in self._stage_params:
            yield self._names.get(id(p), p.name), p
