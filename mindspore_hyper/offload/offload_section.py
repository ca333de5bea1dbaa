"""The offload section of a parallel model's step report (`StepReport.offload`, the `--json`
report's `offload`): the same figures in every mode, from the offload's units, stores and
residency.

Modelled per device (`per_device`; a dry run and the simulation give them equal, byte for byte,
because both follow the same acquire/release order of the same blocks):
  - `stored_bytes`, `stored_blocks`: the offloaded tensors (parameter shards, optimizer states,
    gradients) and the cache blocks they occupy;
  - `host_tier_bytes`, `disk_tier_bytes`: where those blocks rest between uses, the host pool
    filled first (`host_memory` per device), the rest on disk (blocks x block size);
  - `device_tier_peak_pinned_bytes`: the blocks pinned on the device tier at once, x block size:
    what the tier must hold (its cache of unpinned blocks, up to `device_budget_bytes`, comes on
    top and depends on timings); this is what the report's memory per device counts for the
    offloaded units (`offload_device_tier`), in place of their parameters, gradients and states;
  - `peak_materialized_bytes`: parameter and workspace bytes in the Parameters at once;
  - `device_loads_bytes`: the last step's pins of a block that was not pinned, x block size: the
    bytes moved onto the device tier if its cache never held a block between uses (a bound the
    cache lowers, which prefetches of blocks evicted before use could exceed).
Measured (`measured_per_device`, the simulation's C++ stores; None in a dry run, which has no
copies or prefetch workers): the last step's bytes moved per direction, the prefetcher's hits,
late hits and misses, the blocks each tier holds now and the device tier's peak since the store
was made. `offloaded` gives per device and kind the bytes the memory rows no longer count on the
device; `backward_order` the modelled and observed backward (`backward_order.py`).
"""
from __future__ import annotations

from typing import Dict, Iterable, List

from mindspore_hyper.offload.backward_order import BackwardOrder
from mindspore_hyper.runtime.mixed_precision import dtype_name

__all__ = ["offload_section", "MEMORY_KINDS"]

MEMORY_KINDS = ("parameters", "gradients", "optimizer_states")  # what an offloaded parameter stops costing

_TO_DEVICE = ("host->device", "disk->device")
_FROM_DEVICE = ("device->host", "device->disk")


def _blocks(refs: Iterable) -> set:
    return {b for r in refs for b in r.blocks}


def _modelled(units, stores, residency, rank: int) -> Dict[str, int]:
    store = stores[rank]
    devs = [u.devices[rank] for u in units]
    refs = [r for d in devs for r in (*d.params, *d.states, *d.grads)]
    blocks = len(_blocks(refs))
    host_blocks = min(blocks, store.host_memory // store.block_size)
    return {"stored_bytes": sum(r.nbytes for r in refs), "stored_blocks": blocks,
            "host_tier_bytes": host_blocks * store.block_size,
            "disk_tier_bytes": (blocks - host_blocks) * store.block_size,
            "device_tier_peak_pinned_bytes": store.pins.peak_blocks * store.block_size,
            "peak_materialized_bytes": residency.peak_materialized[rank],
            "device_loads_bytes": store.pins.step_loads * store.block_size}


def _measured(store) -> Dict[str, int]:
    now, start = store.stats(), store.step_start
    moved = lambda pairs: sum(now["bytes_moved"][p] - (start["bytes_moved"][p] if start else 0)  # noqa: E731
                              for p in pairs)
    prefetch = lambda key: now["prefetch"][key] - (start["prefetch"][key] if start else 0)  # noqa: E731
    return {"bytes_to_device": moved(_TO_DEVICE), "bytes_from_device": moved(_FROM_DEVICE),
            "bytes_host_to_disk": moved(("host->disk",)), "bytes_disk_to_host": moved(("disk->host",)),
            "prefetch_hits": prefetch("hits"), "prefetch_late": prefetch("late"),
            "prefetch_misses": prefetch("misses"),
            "device_tier_bytes": now["device"]["used_blocks"] * store.block_size,
            "host_tier_bytes": now["host"]["used_blocks"] * store.block_size,
            "disk_tier_bytes": now["disk"]["used_blocks"] * store.block_size,
            "device_tier_peak_bytes": now["device"]["peak_bytes"]}


def _offloaded(units, model, ranks: List[int]) -> Dict[int, Dict[str, Dict[str, int]]]:
    """rank -> kind -> dtype -> the bytes the model's memory rows count for the offloaded
    parameters (their strategy-table rows: parameter and gradient shards, optimizer states)."""
    out = {rank: {kind: {} for kind in MEMORY_KINDS} for rank in ranks}
    for u in units:
        for p in u.params:
            row = model.rows[id(p)]
            name = dtype_name(row.dtype)
            for rank in ranks:
                if rank not in row.devices:
                    continue
                for kind, nbytes in zip(MEMORY_KINDS, (row.param_bytes, row.param_bytes, row.optimizer_bytes)):
                    out[rank][kind][name] = out[rank][kind].get(name, 0) + nbytes
    return out


def offload_section(units, stores, residency, order: BackwardOrder, model, ranks: List[int],
                    measured: bool) -> Dict:
    """The section (module docstring) for the devices `ranks` of `model`.

    Args:
        units: the offload units (their `devices` parallel to `stores`).
        stores: one per device (`OffloadStore` in simulation, `ShapeStore` in a dry run).
        residency: the units' residency (its per-device peak of materialized bytes).
        order: the last step's backward order.
        model: the ParallelModel the units belong to (its strategy-table rows).
        ranks: the devices to report.
        measured: whether the stores measured copies and prefetches (the C++ stores).

    Returns:
        The section as plain data.
    """
    return {"block_size": stores[0].block_size, "device_budget_bytes": stores[0].device_memory,
            "per_device": {rank: _modelled(units, stores, residency, rank) for rank in ranks},
            "measured_per_device": ({rank: _measured(stores[rank]) for rank in ranks} if measured else None),
            "offloaded": _offloaded(units, model, ranks),
            "offloaded_parameters": [model.rows[id(p)].name for u in units for p in u.params],
            "backward_order": order.to_dict(), "backward_order_text": order.text()}

