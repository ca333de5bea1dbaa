"""Identity ops MindSpore inserts around Cells with hooks (e.g. CellBackwardHook, used by
HyperOffload's hooks that bring parameters in for a Cell's backward).

Every output keeps its input's layout. The hook op runs on the first distinct shard only (the
others pass through unchanged), so each hook fires once per Cell call as on a single device;
the shards' own backward reads their saved slices, not the live Parameter.
"""
from __future__ import annotations

from mindspore_hyper.dtensor.rules.registry import Decision, register


@register("CellBackwardHook")
def cell_backward_hook(call):
    layouts = [t.layout for t in call.tensors]
    structure = {}

    def local_fn(call_, inputs, coords):
        if not structure:  # the first key (all coordinates 0) runs the real hook op
            out = call_.run(inputs)
            structure["sequence"] = isinstance(out, (tuple, list))
            return out
        passed = [v for item in inputs for v in (item if isinstance(item, (tuple, list)) else [item])]
        return tuple(passed) if structure["sequence"] else passed[0]

    return Decision(inputs=layouts, outputs=layouts, local_fn=local_fn)
