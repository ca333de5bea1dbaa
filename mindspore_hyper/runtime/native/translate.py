"""Native translation: a resolved StrategyTable -> MindSpore's own semi-auto parallel.

`apply_native(model, table)` sets `Primitive.shard(...)` with `mindspore.parallel.Layout` results
on the primitives of supported Cells, marks pipeline stages on Cells, and wraps the model in
`mindspore.parallel.auto_parallel.AutoParallel(model, "semi_auto")` configured with `hsdp()`
(optimizer sharding), `pipeline()` and `dataset_strategy()`. The rules per Cell type are in
docs/native.md. MindSpore compiles this only on Ascend/GPU; on CPU only the attributes can be
inspected (MindSpore refuses "Invalid backend: CPU").
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.shard.layout import NONE_ALIAS, Layout
from mindspore_hyper.strategy.resolve import ParamRow, StrategyTable
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["NativePlan", "apply_native", "native_mesh"]

MATMUL_PRIMS = ("MatMul",)


@dataclass
class NativePlan:
    """What the native translation set, for inspection (attached to the returned net as `hyper_native_plan`).

    Attributes:
        mesh: the device matrix handed to MindSpore (the pipeline axis removed when staged).
        primitive_layouts: "<cell>.<primitive attribute>" -> the `in_layout` dicts set by shard().
        parameter_layouts: parameter name -> MindSpore layout dict the primitives imply for it.
        cell_stages: Cell name -> pipeline stage set as `cell.pipeline_stage`.
        pipeline_stages: stages passed to `AutoParallel.pipeline` (1 = not called).
        hsdp: keyword arguments passed to `AutoParallel.hsdp`, or None.
        dataset_strategy: what was passed to `AutoParallel.dataset_strategy`.
        skipped: Cells or groups not translated, with the reason.
    """

    mesh: Layout
    primitive_layouts: Dict[str, Tuple[dict, ...]] = field(default_factory=dict)
    parameter_layouts: Dict[str, dict] = field(default_factory=dict)
    cell_stages: Dict[str, int] = field(default_factory=dict)
    pipeline_stages: int = 1
    hsdp: Optional[dict] = None
    dataset_strategy: object = None
    skipped: List[str] = field(default_factory=list)


def native_mesh(table: StrategyTable) -> Layout:
    """The device matrix MindSpore's strategies are written on.

    With pipeline stages MindSpore splits the devices into stages itself, and an operator's layout
    describes the devices of one stage: the pipeline axis is dropped. Otherwise the mesh as is.
    """
    mesh = table.mesh
    if table.pipeline_stages > 1 and table.config is not None and table.config.pipeline_axis in mesh.alias_names:
        keep = [i for i, a in enumerate(mesh.alias_names) if a != table.config.pipeline_axis]
        return Layout([mesh.device_matrix[i] for i in keep], [mesh.alias_names[i] for i in keep])
    return mesh


def apply_native(model, table: StrategyTable, activation_ndim: int = 2,
                 input_ndims: Optional[Sequence[int]] = None, pipeline_scheduler: str = "1f1b",
                 parallel_mode: str = "semi_auto"):
    """Translate `table` onto `model` for MindSpore's semi-auto parallel and wrap it in AutoParallel.

    Args:
        model: the `nn.Cell` the table was resolved on (its primitives are modified in place).
        table: the StrategyTable from `resolve_strategy(model, ...)`.
        activation_ndim: rank of activations entering LayerNorm when the Cell cannot tell
            (begin_params_axis = -1), and of each model input when `input_ndims` is None.
        input_ndims: rank of each model input, for `dataset_strategy`; default: one
            `activation_ndim`-rank input per positional argument of `model.construct`.
        pipeline_scheduler: scheduler passed to `AutoParallel.pipeline` ("1f1b", "gpipe", ...).
        parallel_mode: AutoParallel mode, "semi_auto" by default.

    Returns:
        The `AutoParallel` net wrapping `model`, with `hyper_native_plan` (a NativePlan) and
        `hyper_strategy_table` attributes.

    Raises:
        ValueError: layouts that a supported Cell cannot realise (e.g. a Dense bias laid out
            differently from the weight's output dimension).
    """
    from mindspore.parallel.auto_parallel import AutoParallel

    mesh = native_mesh(table)
    plan = _Translator(model, table, mesh, activation_ndim).run()

    for name, cell in model.cells_and_names():
        if name in table.cell_stages:
            cell.pipeline_stage = table.cell_stages[name]
            plan.cell_stages[name] = table.cell_stages[name]

    net = AutoParallel(model, parallel_mode)
    if table.pipeline_stages > 1:
        net.pipeline(stages=table.pipeline_stages, scheduler=pipeline_scheduler)
        plan.pipeline_stages = table.pipeline_stages
    axis = table.strategy.optimizer_state
    if axis is not None:
        plan.hsdp = {"shard_size": table.mesh.axis_size(axis), "threshold": 0, "optimizer_level": "level1"}
        net.hsdp(**plan.hsdp)
    plan.dataset_strategy = _dataset_strategy(model, table, mesh, activation_ndim, input_ndims)
    net.dataset_strategy(plan.dataset_strategy)
    if table.config is not None and table.config.optimizer_offload:
        plan.skipped.append("optimizer.offload: not translated; native mode keeps optimizer states on the device "
                            "(HyperOffload runs in mode='simulation'/'distributed')")
        warnings.warn("native mode: parallel_config.optimizer.offload is not translated", UserWarning, stacklevel=3)
    if table.groups:
        names = ", ".join(f"{g.name} ({g.kind})" for g in table.groups)
        plan.skipped.append(f"device groups {names}: MPMD is not expressible in AutoParallel; run them with "
                            "mode='simulation' or 'distributed'")
        warnings.warn(f"native mode: device groups not translated: {names}", UserWarning, stacklevel=3)
    net.hyper_native_plan = plan
    net.hyper_strategy_table = table
    return net


def _dataset_strategy(model, table: StrategyTable, mesh: Layout, activation_ndim: int,
                      input_ndims: Optional[Sequence[int]]):
    strategy = table.strategy
    tmap = strategy.input_map if strategy.input_map is not None else (
        (strategy.data_axis,) if strategy.data_axis else ())
    if not tmap:
        return "full_batch"
    if input_ndims is None:
        params = [p for p in inspect.signature(model.construct).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        input_ndims = [activation_ndim] * max(1, len(params))
    out = []
    for ndim in input_ndims:
        entries = list(tmap[:ndim]) + [None] * (ndim - len(tmap))
        out.append(_ms(TensorLayout(mesh, entries)))
    return tuple(out)


def _ms(layout: TensorLayout):
    entries = [NONE_ALIAS if e is None else e for e in layout.tensor_map]
    return layout.mesh.to_mindspore()(*entries)


class _Translator:
    def __init__(self, model, table: StrategyTable, mesh: Layout, activation_ndim: int):
        self.model = model
        self.table = table
        self.mesh = mesh
        self.activation_ndim = activation_ndim
        self.plan = NativePlan(mesh=mesh)
        data = table.strategy.data_axis
        self.data_axis = data if data in mesh.alias_names else None

    def run(self) -> NativePlan:
        from mindspore import nn

        for name, cell in self.model.cells_and_names():
            rows = [r for r in self.table if r.cell == name]
            if not rows:
                continue
            if any(r.group is not None for r in rows):
                continue  # reported once per group by apply_native
            if isinstance(cell, nn.Dense):
                self._dense(name, cell)
            elif isinstance(cell, nn.LayerNorm):
                self._layer_norm(name, cell)
            elif isinstance(cell, nn.Embedding):
                self._embedding(name, cell)
            elif not self._matmul_cell(name, cell, rows):
                sharded = [r.name for r in rows if r.layout.sharded_axes()]
                reason = (f"Cell {name!r} ({type(cell).__name__}) has no native translation rule; MindSpore will "
                          f"choose its operators' strategies")
                self.plan.skipped.append(reason)
                if sharded:
                    warnings.warn(f"native mode: {reason}, so the sharded parameters {sharded} may not get the "
                                  "resolved layout", UserWarning, stacklevel=4)
        return self.plan

    # -- helpers -----------------------------------------------------------------------------
    def _layout(self, row: ParamRow) -> TensorLayout:
        return TensorLayout(self.mesh, row.layout.tensor_map)

    def _batch(self, *layouts: TensorLayout) -> Optional[str]:
        """The data axis for a batch dimension, unless a parameter layout already uses it."""
        if self.data_axis is None:
            return None
        used = {self.mesh.alias_names[a] for lay in layouts for a in lay.sharded_axes()}
        return None if self.data_axis in used else self.data_axis

    def _shard(self, cell_name: str, attr: str, prim, layouts: Sequence[TensorLayout],
               params: Dict[str, TensorLayout]) -> None:
        prim.shard(tuple(_ms(lay) for lay in layouts))
        self.plan.primitive_layouts[f"{cell_name}.{attr}" if cell_name else attr] = tuple(prim.attrs["in_layout"])
        for pname, lay in params.items():
            self.plan.parameter_layouts[pname] = _ms(lay).to_dict()

    # -- rules -------------------------------------------------------------------------------
    def _dense(self, name: str, cell) -> None:
        """x(N, in) @ W(out, in)^T: MatMul in_layout (x: (batch, W_in), W); BiasAdd (y: (batch, W_out), b = W_out)."""
        w_row = self.table[f"{name}.weight"]
        w = self._layout(w_row)
        b = None
        if cell.has_bias:
            b_row = self.table[f"{name}.bias"]
            b = self._layout(b_row)
            if b.tensor_map != (w.tensor_map[0],):
                raise ValueError(
                    f"native mode: nn.Dense {name!r}: bias layout {b_row.layout.tensor_map} (from {b_row.source}) must "
                    f"equal the weight's output-dimension layout ({w.tensor_map[0]},) (weight layout "
                    f"{w_row.layout.tensor_map} from {w_row.source}); BiasAdd needs them equal")
        batch = self._batch(w)
        x = TensorLayout(self.mesh, (batch, w.tensor_map[1]))
        self._shard(name, "matmul", cell.matmul, (x, w), {w_row.name: w})
        if b is not None:
            y = TensorLayout(self.mesh, (batch, w.tensor_map[0]))
            self._shard(name, "bias_add", cell.bias_add, (y, b), {f"{name}.bias": b})

    def _layer_norm(self, name: str, cell) -> None:
        """LayerNorm(x, gamma, beta): x = (batch, None..., gamma's layout); gamma and beta as resolved."""
        g_row, b_row = self.table[f"{name}.gamma"], self.table[f"{name}.beta"]
        g, b = self._layout(g_row), self._layout(b_row)
        if g.tensor_map != b.tensor_map:
            raise ValueError(f"native mode: nn.LayerNorm {name!r}: gamma layout {g.tensor_map} and beta layout "
                             f"{b.tensor_map} must be equal (both are applied to the same normalized dimensions)")
        begin = cell.begin_params_axis
        ndim = begin + g.ndim if begin >= 0 else max(self.activation_ndim, g.ndim + 1)
        lead = ndim - g.ndim
        batch = self._batch(g) if lead > 0 else None
        x = TensorLayout(self.mesh, ((batch,) + (None,) * (lead - 1) if lead else ()) + g.tensor_map)
        if g.sharded_axes():
            warnings.warn(f"native mode: nn.LayerNorm {name!r} normalizes over dimensions split as {g.tensor_map}; "
                          "MindSpore may reject or gather them at compile time (not checkable on CPU)",
                          UserWarning, stacklevel=5)
        self._shard(name, "layer_norm", cell.layer_norm, (x, g, b), {g_row.name: g, b_row.name: b})

    def _embedding(self, name: str, cell) -> None:
        """Gather(table, ids) with table as resolved and the flattened ids split on the batch axis;
        with use_one_hot the MatMul(one_hot(ids) (N, vocab), table) gets (batch, table_vocab), table."""
        t_row = self.table[f"{name}.embedding_table"]
        t = self._layout(t_row)
        batch = self._batch(t)
        if cell.use_one_hot:
            x = TensorLayout(self.mesh, (batch, t.tensor_map[0]))
            self._shard(name, "array_mul", cell.array_mul, (x, t), {t_row.name: t})
        else:
            ids = TensorLayout(self.mesh, (batch,))
            self._shard(name, "gather", cell.gather, (t, ids), {t_row.name: t})

    def _matmul_cell(self, name: str, cell, rows: List[ParamRow]) -> bool:
        """A Cell owning one 2-D parameter W and one MatMul primitive is read as matmul(x, W):
        x = (batch, W's contraction entry) (transposed when transpose_a), W as resolved."""
        from mindspore.ops import Primitive

        prims = [(attr, p) for attr, p in vars(cell).items()
                 if isinstance(p, Primitive) and p.name in MATMUL_PRIMS]
        weights = [r for r in rows if len(r.global_shape) == 2]
        if len(prims) != 1 or len(weights) != 1 or len(rows) != 1:
            return False
        attr, prim = prims[0]
        row = weights[0]
        w = self._layout(row)
        transpose_a = bool(prim.attrs.get("transpose_a", prim.attrs.get("transpose_x1", False)))
        transpose_b = bool(prim.attrs.get("transpose_b", prim.attrs.get("transpose_x2", False)))
        k = w.tensor_map[1] if transpose_b else w.tensor_map[0]
        batch = self._batch(w)
        x = TensorLayout(self.mesh, (k, batch) if transpose_a else (batch, k))
        self._shard(name, attr, prim, (x, w), {row.name: w})
        return True
