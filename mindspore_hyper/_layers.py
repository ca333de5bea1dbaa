"""The package's layers, lowest first: the one table that docs/architecture.md and
tests/test_structure.py share (data only; it imports nothing).

A unit is a sub-package or module of `mindspore_hyper`, named without the package prefix
("runtime.simulation" holds every module under mindspore_hyper/runtime/simulation/; "runtime"
the modules of mindspore_hyper/runtime/ that no longer entry claims); "" is the package's own
`__init__.py`, the public facade. A module may import modules of its own layer and of the layers
below; an import up the layers, or an import circle between modules, fails the structure test
unless it is listed below with the issue item that removes it. `python tests/test_structure.py`
rewrites the layer section of docs/architecture.md from this table.
"""

# (layer, units, what they hold), lowest first
LAYERS = (
    ("foundation", ("units", "context", "autodiff", "_core", "_layers", "_resources", "mindspore_log",
                    "bfloat16_emulation", "softmax_backward_cache"),
     "byte and dtype units, context flags, MindSpore grad helpers, the C++ core (extension module), "
     "the data files shipped in the package, the MindSpore log messages kept off the console, the bfloat16 "
     "ops MindSpore's CPU kernels lack, run on float32 copies, the guard of MindSpore's cached Softmax backward"),
    ("algebra", ("shard",), "Layout (mesh), TensorLayout, placements, redistribution planner; Strategy, the "
                            "model-wide declaration over a mesh (`layout(tensor_map=...)` builds it, no hook)"),
    ("strategy, communication", ("strategy", "comm"),
     "YAML config, process groups, resolve (Strategy or config) -> StrategyTable; Collectives protocol, backends, "
     "transports, topology, cost model"),
    ("DTensor", ("dtensor",), "DTensor, dispatch, rules (one module per op family), Execution, shard hints"),
    ("plans (data)", ("schedule",),
     "pipeline schedules, validation, simulation, rebalance plans; Span and Timeline with their writers"),
    ("runtimes", ("runtime", "runtime.simulation", "runtime.distributed", "runtime.native", "runtime.dryrun",
                  "runtime.modes"),
     "Runtime template, ParallelModel, StepReport; the simulation, msrun and native runtimes; the mode -> "
     "runtime lookup (`runtime/modes.py`)"),
    ("compositions", ("pipeline", "mpmd"),
     "pipeline stages and MPMD device groups, composed over the runtimes"),
    ("features", ("offload", "moe", "rlhf", "multimodal", "data"),
     "HyperOffload, mixture of experts, PPO on device groups, the multimodal encoder pipeline, the sharded "
     "resumable data loader"),
    ("entry points", ("parallelize", "checkpoint", "launch", "migrate"),
     "auto_parallelize, distributed checkpoints, elastic relaunch, PyTorch migration"),
    ("HyperParallel API", ("hyper_parallel",),
     "upstream's hyper_parallel API (DeviceMesh, DTensor views, styles, parallelize_module) over the runtimes"),
    ("public API", ("",), "mindspore_hyper/__init__.py: the names users import"),
    ("tools", ("cli", "estimate", "train", "tools"),
     "the mindspore-hyper command line, memory/time estimation (it cross-checks through the public API), step "
     "telemetry (MFU from the estimator), the op and layer coverage sweeps (`tools/coverage/`: they drive the "
     "DTensors and the simulation runtime)"),
)

# Modules written in C++ (no .py file): `from mindspore_hyper import _core` is an edge to it.
EXTENSION_MODULES = ("_core",)

# Import circles between modules still open: the modules of each, and the issue item that opens it.
# A circle found must be one of these (or part of one); an entry whose circle is gone must be deleted.
KNOWN_CIRCLES = (
)

# Imports up the layers still open: (importer, imported) modules, and the issue item that removes it.
KNOWN_UPWARD = ()

# Import circles between units (a unit's modules import another unit's and back) still open.
KNOWN_UNIT_CIRCLES = (
)
