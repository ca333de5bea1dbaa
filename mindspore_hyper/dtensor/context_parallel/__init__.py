"""Context parallelism: attention on sequence-sharded q/k/v without a device ever holding the whole
score matrix (docs/context_parallel.md).

- `scores`: the value types (the element-wise steps, the deferred scores' expression); `attend`
  picks the method.
- `expression`: recognises attention written as ops (`q @ k^T`, scaling, additive or filled
  masks, softmax, `@ v`: the examples' GPT, converted models' scaled_dot_product_attention) by
  deferring the score matrix until the softmax's result meets V; any other reader of the
  deferred scores gets them computed the ordinary way.
- `ring`: ring attention on DTensors (layouts, masks, zigzag and skipped blocks, accounting);
  `ring_core`: its forward and hand-written backward ring (online softmax, recomputation from the
  rows' log-sum-exp), the same math in simulation and under msrun; `ring_transports`: how the
  ring's tensors move (members in this process, or the process collectives); `ring_shapes`: the
  ring in a dry run (the same plan and moves on shapes), its skipped blocks from a causal mask's
  structure (`diagonal_mask`) instead of its values.
- `ulysses`: AllToAll to head-sharded q/k/v, attention on whole sequences, AllToAll back.
- `multihead`: `nn.MultiheadAttention` (so `nn.TransformerEncoderLayer` / `nn.Transformer*`).

Wiring: a context-parallel ParallelModel sets `Execution.context_attention` to
`expression.intercept` (the dispatcher calls it first for every op) and installs `multihead`.
"""
