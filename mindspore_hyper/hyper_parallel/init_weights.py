"""Delayed parameter initialisation (HyperParallel's `init_parameters`, `init_empty_weights`,
`init_on_device`) over MindSpore's `no_init_parameters`.

A model built under `no_init_parameters()` (or `init_empty_weights()`) holds no values until
they are needed. Laying its Parameters out (parallelize_module, fully_shard, distribute_module)
initialises them then: in simulation the global Parameter, under msrun each process keeps only
its piece of the value an ordinary initialisation with the same seed gives (the host builds the
whole value once to cut it: on this CPU package host and device are one memory).
`init_parameters(module)` initialises whatever is still delayed.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from mindspore import nn

__all__ = ["init_parameters", "init_empty_weights", "init_on_device"]

DEVICES = ("cpu", "npu", "gpu", "cuda", "ascend", "meta")


def init_parameters(module: nn.Cell, stage_index: int = 0) -> nn.Cell:
    """Initialise `module`'s Parameters that are still delayed (values equal to an ordinary
    initialisation with the same seed).

    Raises:
        ValueError: `module` is not a Cell, or a pipeline `stage_index` (pipeline stages are not
            provided by this API yet).
    """
    if not isinstance(module, nn.Cell):
        raise ValueError(f"init_parameters: expected an nn.Cell, got {type(module).__name__}")
    if stage_index != 0:
        raise ValueError("init_parameters(stage_index=...): pipeline stages are not provided by this API yet; pass 0")
    module.init_parameters_data()
    return module


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build Cells without initialising their Parameters (MindSpore's `no_init_parameters`).

    Raises:
        ValueError: include_buffers=True (a MindSpore Cell keeps its state in Parameters).
    """
    if include_buffers:
        raise ValueError("init_empty_weights(include_buffers=True): MindSpore Cells have no buffers apart from "
                         "Parameters; pass False")
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        yield


@contextlib.contextmanager
def init_on_device(device, include_buffers: bool = False) -> Iterator[None]:
    """Build Cells with their Parameters on `device`: "meta" delays their initialisation
    (`init_empty_weights`); any other device builds them as usual (this package's modes run on
    the host).

    Raises:
        ValueError: an unknown device.
    """
    name = str(getattr(device, "type", device)).split(":")[0].lower()
    if name not in DEVICES:
        raise ValueError(f"init_on_device: device {device!r}; expected one of {DEVICES}")
    if name == "meta":
        with init_empty_weights(include_buffers):
            yield
    else:
        yield
