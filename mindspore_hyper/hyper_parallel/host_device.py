"""Laying Parameters out on the host inside MindSpore's `DeviceCtx("meta")`.

MindFormers 2.0 calls `fully_shard` (and `parallelize_module`) inside `mindspore.DeviceCtx("meta")`,
because its models are built there and initialised later. Inside that context every tensor
MindSpore creates lives on the meta device: it has a shape and no values. Under msrun laying a
Parameter out cuts this process's piece from the Parameter's values into a new Parameter, which
in that context would be a meta tensor (and the broadcast of the initial value and the
`asnumpy()` of the old Parameter fail: "Not support copy between src:meta and dst:CPU"). As
torch's `torch.device("meta")` context, which changes factories only and leaves a slice of a real
tensor real, the pieces of a Parameter holding values stay values: the layout runs on the host.

A Parameter that itself lives on the meta device (built under `DeviceCtx("meta")`) holds no
values, and MindSpore 2.10 cannot initialise it anywhere else: it is refused, naming it and the
way to delay initialisation that works here (`init_empty_weights()` / `no_init_parameters()`).
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

from mindspore import Parameter

__all__ = ["on_host", "check_not_meta"]

META = "meta"  # MindSpore's name of the device that holds shapes only
HOST = "CPU"  # the device this package computes on


def check_not_meta(params: Iterable[Parameter], caller: str) -> None:
    """Refuse Parameters that live on MindSpore's meta device (they hold no values).

    Args:
        params: the Parameters about to be laid out.
        caller: the API function, for the message.

    Raises:
        ValueError: a Parameter lives on the meta device.
    """
    for param in params:
        if str(getattr(param, "device", "")) == META:
            raise ValueError(f"{caller}: parameter {param.name!r} lives on MindSpore's meta device (the model was "
                             "built inside mindspore.DeviceCtx('meta')): it holds no values, and MindSpore cannot "
                             "initialise it on the host; build the model under hyper_parallel.init_empty_weights() "
                             "(MindSpore's no_init_parameters()) to delay its initialisation, or outside the meta "
                             "context")


@contextlib.contextmanager
def on_host() -> Iterator[None]:
    """Run the block on the host device when the caller is inside `mindspore.DeviceCtx("meta")`
    (module docstring); otherwise leave the device as it is."""
    from mindspore import DeviceCtx
    from mindspore.device_manager import get_current_device

    if get_current_device().device_target != META:
        yield
        return
    with DeviceCtx(HOST):
        yield
