"""`custom_shard`: run a function on the local parts of its DTensor arguments (HyperParallel's
`custom_shard`, torch's `local_map`).

Each DTensor argument is moved to its `in_placements` (unless `redistribute_inputs=False`) and
replaced by its local part; the function's tensor results are taken as each rank's part of a
DTensor with `out_placements`. In simulation the local parts are rank-local values, so the
function runs once per distinct rank value, as each device would run it.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from mindspore import Tensor

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh

__all__ = ["custom_shard"]


def custom_shard(func: Callable, device_mesh: DeviceMesh, out_placements: Sequence,
                 in_placements: Optional[Sequence] = None, redistribute_inputs: bool = True) -> Callable:
    """`func` wrapped to run on local parts (see module docstring).

    Args:
        func: the function, written for one device's local tensors.
        device_mesh: the mesh of the DTensors.
        out_placements: one placements tuple per output (None for a non-tensor output).
        in_placements: one placements tuple per positional argument (None for a non-DTensor one).
        redistribute_inputs: move DTensor arguments to `in_placements` first; False requires them there.

    Returns:
        The wrapped function: DTensors in, DTensors out (plain in, the function's own results out).

    Raises:
        ValueError: (when called) counts that do not match, a DTensor argument without placements,
            placements for a non-DTensor argument or a non-tensor output, or (redistribute_inputs=False)
            a DTensor not already at its placements.
    """
    def wrapped(*args, **kwargs):
        if in_placements is not None and len(in_placements) != len(args):
            raise ValueError(f"custom_shard: in_placements has {len(in_placements)} entries for {len(args)} "
                             "positional arguments")
        local_args, distributed = [], False
        for i, arg in enumerate(args):
            wanted = in_placements[i] if in_placements is not None else None
            if not isinstance(arg, DTensor):
                if wanted is not None:
                    raise ValueError(f"custom_shard: argument {i} is not a DTensor but in_placements[{i}]={wanted!r}; "
                                     "pass None for it")
                local_args.append(arg)
                continue
            if wanted is None:
                raise ValueError(f"custom_shard: argument {i} is a DTensor; give its placements in in_placements")
            if redistribute_inputs:
                arg = arg.redistribute(device_mesh, tuple(wanted))
            elif arg.placements != tuple(wanted):
                raise ValueError(f"custom_shard: argument {i} has placements {arg.placements}, in_placements says "
                                 f"{tuple(wanted)} and redistribute_inputs=False")
            local_args.append(arg.to_local())
            distributed = True
        out = func(*local_args, **kwargs)
        if not distributed:
            return out
        outputs = out if isinstance(out, tuple) else (out,)
        if len(outputs) != len(out_placements):
            raise ValueError(f"custom_shard: {len(outputs)} outputs but {len(out_placements)} out_placements")
        results = []
        for i, (value, placements) in enumerate(zip(outputs, out_placements)):
            if isinstance(value, Tensor):
                if placements is None:
                    raise ValueError(f"custom_shard: output {i} is a tensor; give its placements in out_placements")
                results.append(DTensor.from_local(value, device_mesh, tuple(placements)))
            else:
                if placements is not None:
                    raise ValueError(f"custom_shard: output {i} is not a tensor but out_placements[{i}]={placements!r}")
                results.append(value)
        return tuple(results) if isinstance(out, tuple) else results[0]

    return wrapped
