"""Coverage sweeps: which MindSpore ops and `nn` layers run on DTensors, checked against one device.

- `op_catalog`: the op cases (`OpCase`, `CATALOG`); `op_sweep` runs each on DTensors laid out every
  way on a 2x2 mesh and writes the op table of docs/op_coverage.md
  (`python -m mindspore_hyper.tools.coverage.op_sweep`).
- `layer_catalog`: the layer zoo (`LayerCase`, `LAYERS`); `layer_sweep` trains each one step in
  simulation under several strategies and writes the layer-zoo section
  (`python -m mindspore_hyper.tools.coverage.layer_sweep --write`).

Nothing in the package imports these modules: they sit above the runtimes they drive.
"""
