"""The execution modes by name: the one lookup from a `mode` string to its Runtime.

`auto_parallelize` (parallelize.py) and the entries of the packages that take a `mode=` argument
or read the `mode` context flag (the RLHF trainer, the encoder pipeline) resolve the name here
once; below that entry only the Runtime object is asked (runtime/base.py), never the name.
A new mode is a folder under runtime/ and one entry of `RUNTIMES`.
"""
from __future__ import annotations

from typing import Dict, Optional, Type

from mindspore_hyper.runtime.base import Runtime
from mindspore_hyper.runtime.distributed.runtime import DistributedRuntime
from mindspore_hyper.runtime.dryrun.runtime import DryRunRuntime
from mindspore_hyper.runtime.native.runtime import NativeRuntime
from mindspore_hyper.runtime.simulation.runtime import SimulationRuntime

__all__ = ["RUNTIMES", "runtime_for"]

RUNTIMES: Dict[str, Type[Runtime]] = {"simulation": SimulationRuntime, "distributed": DistributedRuntime,
                                      "native": NativeRuntime, "dryrun": DryRunRuntime}


def runtime_for(mode: str) -> Optional[Runtime]:
    """A new Runtime of mode `mode`, or None for a name that is no mode."""
    cls = RUNTIMES.get(mode)
    return cls() if cls is not None else None
