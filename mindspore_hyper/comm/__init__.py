"""Communication library: message aggregation into super-packets, algorithm choice by size from
an alpha-beta model, topology-aware routing; in-process, shared-memory and MindSpore transports.

Main entry points:

* `InProcessCommunicator(size, topology=...)` -- every rank's buffer in this process (simulation mode).
* `ShmCommunicator(name, rank, size)` -- one process per rank on one host (POSIX shared memory).
* `MindSporeCommunicator()` -- under msrun, packets through mint.distributed.
* `Topology`, `load_topology` -- presets (supernode384, node8, ring) and YAML files.
* `Level` -- a network as levels of domains (`Topology.from_levels`; the estimator's hardware).
* `estimate_time`, `choose_algorithm`, `set_threshold`, `force_algorithm` -- the cost model;
  `hierarchical_time` -- its formulas over levels.
* `channel_pool.channel_pool(job, rank)` -- a job rank's point-to-point channels (`p2p.P2PChannel`).

The C++ core is `mindspore_hyper._core.comm`; see docs/comm.md.
"""
from mindspore_hyper.comm._common import CommError, CommMismatch, CommTimeout
from mindspore_hyper.comm._handles import AsyncHandle
from mindspore_hyper.comm.cost import (
    KINDS,
    TransportParams,
    choose_algorithm,
    clear_overrides,
    estimate_time,
    force_algorithm,
    hierarchical_time,
    make_cost_model,
    overrides,
    set_threshold,
)
from mindspore_hyper.comm.inprocess import InProcessCommunicator
from mindspore_hyper.comm.levels import Level
from mindspore_hyper.comm.mindspore_transport import MindSporeCommunicator
from mindspore_hyper.comm.shm import ShmCommunicator, cleanup_stale_segments
from mindspore_hyper.comm.topology import PRESETS, Topology, load_topology

__all__ = [
    "CommError", "CommMismatch", "CommTimeout", "AsyncHandle",
    "KINDS", "TransportParams", "choose_algorithm", "clear_overrides", "estimate_time", "force_algorithm",
    "hierarchical_time", "make_cost_model", "overrides", "set_threshold", "Level",
    "InProcessCommunicator", "MindSporeCommunicator", "ShmCommunicator", "cleanup_stale_segments",
    "PRESETS", "Topology", "load_topology",
]
