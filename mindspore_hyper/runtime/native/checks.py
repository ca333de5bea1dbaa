"""What MindSpore enforces on a primitive's in-strategy that can be checked on CPU.

A semi-auto parallel in-strategy gives one `mindspore.parallel.Layout` result per tensor input:
its tensor map must have one entry per input dimension (the input's rank), every dimension must
divide by the number of devices splitting it, and the device matrix must hold exactly the
devices of one pipeline stage. The Layout must also be one MindSpore accepts (its constructor
and `to_dict` validate aliases and their use).
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

from mindspore_hyper.shard.layout import NONE_ALIAS, Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["check_in_strategy"]


def check_in_strategy(name: str, shapes: Sequence[Tuple[int, ...]], layouts: Sequence[TensorLayout],
                      mesh: Layout) -> None:
    """Check the in-strategy `layouts` of primitive `name` against its observed input `shapes`.

    Raises:
        ValueError: naming the primitive, the input and what MindSpore would refuse.
    """
    if len(shapes) != len(layouts):
        raise ValueError(f"native mode: {name}: {len(layouts)} layouts for {len(shapes)} tensor inputs")
    for i, (shape, layout) in enumerate(zip(shapes, layouts)):
        if layout.ndim != len(shape):
            raise ValueError(f"native mode: {name}: input {i} has rank {len(shape)} (shape {shape}) but its layout "
                             f"{layout.tensor_map} has {layout.ndim} entries")
        for d, size in enumerate(shape):
            splits = layout.shard_count(d)
            if size % splits:
                raise ValueError(f"native mode: {name}: input {i} dimension {d} of size {size} does not divide by "
                                 f"the {splits} devices of {layout.tensor_map[d]!r}")
        entries = [NONE_ALIAS if e is None else e for e in layout.tensor_map]
        try:
            as_dict = mesh.to_mindspore()(*entries).to_dict()
        except Exception as error:  # MindSpore's own validation message
            raise ValueError(f"native mode: {name}: input {i} layout {layout.tensor_map} is refused by "
                             f"mindspore.parallel.Layout: {error}") from error
        if math.prod(as_dict["device_matrix"]) != mesh.size:
            raise ValueError(f"native mode: {name}: device matrix {as_dict['device_matrix']} does not hold the "
                             f"{mesh.size} devices of a stage")
