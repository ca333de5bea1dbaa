"""Hardware for the step-time model: a device's peak compute and memory, the network levels, and the
few achievable-efficiency factors, as data (configs/hardware/*.yaml, each figure with its source).

A preset file (``load_hardware("a100-80gb")``)::

    name: a100-80gb
    peak_tflops: 312                 # dense 16-bit FLOP/s per device, in 1e12
    memory_GB: 80                    # HBM capacity, 1e9 bytes
    memory_bandwidth_GBps: 2039      # HBM bandwidth, 1e9 bytes/s
    levels:                          # innermost first; `devices` = devices in one domain of the level
      - {name: nvlink, devices: 8, bandwidth_GBps: 300, latency_us: 3}      # per device, each way
      - {name: infiniband, devices: 4480, bandwidth_GBps: 25, latency_us: 6}
    attention: materialized          # or flash (scores never stored; causal half skipped)
    efficiency: {matmul: 0.80, memory: 0.80, network: 0.80, message_overhead_us: 5}  # op_overhead_us: 0,
                                     # peer_wait_us: 0 (both optional); attention: the flash kernel's
                                     # fraction of peak (optional; default the matmul factor)
    sources: {peak_tflops: "...", ...}
    validated: "unvalidated: ..."    # optional: the published runs the factors were checked against
                                     # (or "unvalidated"); repeated in every step-time estimate's notes
    kernels: {"qkv | 7.2e+09 FLOP | 3.2e+07 B": [62000, 138000], ...}  # optional: measured op times,
                                     # forward and backward us per call (calibrate_cpu with a job)
    core_sharing: {cores: 2, processes: 4, threads: 1, bound: true}   # optional: the processes share the cores
                                     # (calibrate_cpu; core_sharing.py)
    gemm_tiling: {sms: 108, tiles: [[256, 128], [128, 128]], l2_bandwidth_GBps: 7219}   # optional: each
                                     # GEMM loses its tile and wave quantisation at the best tile (gemm_tiling.py);
                                     # without it a GEMM's efficiency is shape-independent
    allocator: {alignment_bytes: 512, fragmentation: 0.0}   # optional (these defaults): the framework's
                                     # device memory pool rounds every block up to alignment_bytes; the
                                     # report's fragmentation allowance is the rounded peak x (1 + fragmentation)

The levels are the communication library's network of levels (`comm.levels.Level`; its cost
model `comm.cost.hierarchical_time` times the collectives, `estimate.collective_time`), and the
file is read by its reader of network files (`comm.topology.read_yaml`). Errors name the file
and the field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple, Union

from mindspore_hyper._resources import resource_path
from mindspore_hyper.comm.levels import Level
from mindspore_hyper.comm.topology import read_yaml
from mindspore_hyper.estimate.core_sharing import CoreSharing
from mindspore_hyper.estimate.gemm_tiling import GemmTiling

__all__ = ["Level", "Efficiency", "Hardware", "load_hardware", "hardware_presets", "HARDWARE_DIR", "ATTENTION_KERNELS"]

HARDWARE_DIR = resource_path("hardware")  # shipped in the package; configs/hardware of an editable checkout
ATTENTION_KERNELS = ("flash", "materialized")
_TOP_KEYS = ("name", "description", "peak_tflops", "memory_GB", "memory_bandwidth_GBps", "levels", "attention",
             "efficiency", "sources", "kernels", "core_sharing", "validated", "gemm_tiling", "allocator")
_LEVEL_KEYS = ("name", "devices", "bandwidth_GBps", "latency_us")
_EFFICIENCY_KEYS = ("matmul", "memory", "network", "message_overhead_us", "op_overhead_us", "peer_wait_us",
                    "attention")
_EFFICIENCY_REQUIRED = ("matmul", "memory", "network", "message_overhead_us")
_CORE_SHARING_KEYS = ("cores", "processes", "threads")
_CORE_SHARING_OPTIONAL = ("bound",)
_GEMM_TILING_KEYS = ("sms", "tiles")
_GEMM_TILING_OPTIONAL = ("l2_bandwidth_GBps",)
_ALLOCATOR_KEYS = ("alignment_bytes", "fragmentation")
# MindSpore 2.10's device memory pool (include/mindspore/ccsrc/include/runtime/memory/mem_pool/
# dynamic_mem_pool.h, kDynamicMemAlignSize and DynamicMemPool::AlignMemorySize, which the Ascend
# pool delegates to): every block rounded up to a multiple of 512 bytes, an empty one to 512
POOL_ALIGNMENT_BYTES = 512


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of the peaks, the same for every model on a hardware.

    Attributes:
        matmul: fraction of peak FLOP/s a large matrix multiply reaches.
        memory: fraction of HBM bandwidth a memory-bound kernel reaches.
        network: fraction of a level's bandwidth a collective reaches (bus bandwidth / link).
        message_overhead: seconds of software cost per collective step, added to each level's latency.
        op_overhead: seconds of dispatch cost per op launch, added to its roofline time (0 where
            launches are asynchronous and hidden, as on GPUs and NPUs; the `cpu` profile measures
            MindSpore's PyNative dispatch).
        peer_wait: seconds a rank waits per blocking collective for group peers that reached it
            later, beyond the transfer (0 on dedicated devices; the `cpu` profile measures it when
            more processes than cores take turns on the cores).
        attention: fraction of peak FLOP/s a fused (flash) attention kernel reaches, forward and
            backward; None: the matmul factor (a materialised attention core is timed as its GEMMs).
    """

    matmul: float
    memory: float
    network: float
    message_overhead: float
    op_overhead: float = 0.0
    peer_wait: float = 0.0
    attention: Optional[float] = None


@dataclass(frozen=True)
class Hardware:
    """A device and the network around it (SI units: FLOP/s, bytes, bytes/s, seconds).

    Attributes:
        name: preset or file name.
        peak_flops: dense 16-bit FLOP/s per device.
        memory_bytes: device memory capacity.
        memory_bandwidth: device memory bytes/s.
        levels: network levels, innermost first, each domain size dividing the next.
        efficiency: the achievable-efficiency factors.
        attention: "flash" (fused kernel: no score matrix in memory, the causal half skipped) or
            "materialized" (scores written, softmaxed and read back; full s x s computed).
        description: free text.
        sources: where each figure comes from (field -> citation).
        kernels: measured op times that replace the roofline for ops of exactly that shape:
            `layer_ops.kernel_key(op)` -> (forward seconds, backward seconds) of one call
            (`calibrate_cpu` with a job; empty for the presets).
        core_sharing: the processes share the host's cores (`calibrate_cpu`): how fast a rank
            computes while fewer ranks compute than when the kernels were measured; None for
            devices that compute on their own (the presets).
        validated: which published runs the efficiency factors were checked against ("unvalidated"
            or "unvalidated: why" where none); the step-time estimate repeats it in its notes. None:
            the file does not say (no note).
        gemm_tiling: the GEMM library's tiling (SMs and tile): each GEMM's efficiency is scaled by
            its tile and wave quantisation (`gemm_tiling.tile_utilisation`); None: shape-independent.
        allocator_alignment: bytes the device memory pool rounds every block up to (the report's
            step peak "rounded"; MindSpore's pool: 512).
        fragmentation: the fragmentation allowance, a fraction of the rounded step peak (default 0:
            none assumed; no measurement of it on this hardware is shipped).
    """

    name: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth: float
    levels: Tuple[Level, ...]
    efficiency: Efficiency
    attention: str = "flash"
    description: str = ""
    sources: Dict[str, str] = field(default_factory=dict)
    kernels: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    core_sharing: Optional[CoreSharing] = None
    validated: Optional[str] = None
    gemm_tiling: Optional[GemmTiling] = None
    allocator_alignment: int = POOL_ALIGNMENT_BYTES
    fragmentation: float = 0.0

    @property
    def max_devices(self) -> int:
        """Devices of the largest domain (the whole cluster)."""
        return self.levels[-1].devices

    def with_efficiency(self, **changes: float) -> "Hardware":
        """A copy with some efficiency factors changed (`matmul=0.7`, ...)."""
        from dataclasses import replace

        return replace(self, efficiency=replace(self.efficiency, **changes))


def hardware_presets() -> Tuple[str, ...]:
    """Names of the preset files in configs/hardware (without .yaml)."""
    if not os.path.isdir(HARDWARE_DIR):
        return ()
    return tuple(sorted(f[:-5] for f in os.listdir(HARDWARE_DIR) if f.endswith(".yaml")))


def load_hardware(spec: Union[str, Dict[str, Any], Hardware]) -> Hardware:
    """A Hardware from a preset name, a YAML path, a mapping, or a Hardware (returned as is).

    Raises:
        ValueError: unknown preset, unreadable file, or a bad field (named with the file).
    """
    if isinstance(spec, Hardware):
        return spec
    if isinstance(spec, dict):
        return hardware_from_dict(spec, "<dict>")
    if not isinstance(spec, str):
        raise ValueError(f"hardware={spec!r}: expected a preset name ({', '.join(hardware_presets())}), "
                         f"a .yaml path, a mapping or a Hardware")
    path = spec if spec.endswith((".yaml", ".yml")) else os.path.join(HARDWARE_DIR, spec + ".yaml")
    if not spec.endswith((".yaml", ".yml")) and not os.path.isfile(path):
        raise ValueError(f"hardware={spec!r}: unknown preset; expected one of {', '.join(hardware_presets())} "
                         f"or a .yaml path")
    return hardware_from_dict(read_yaml(path, "hardware"), path)


def _number(source: str, name: str, value: Any, low: float = 0.0, high: float = float("inf"),
            inclusive_low: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if ok:
        ok = (value >= low if inclusive_low else value > low) and value <= high
    if not ok:
        bound = f"{'>=' if inclusive_low else '>'} {low:g}" + ("" if high == float("inf") else f" and <= {high:g}")
        raise ValueError(f"hardware {source!r}: field {name!r}: expected a number {bound}, got {value!r}")
    return float(value)


def _mapping(source: str, name: str, value: Any, known: Tuple[str, ...], required: Tuple[str, ...]) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"hardware {source!r}: field {name!r}: expected a mapping, got {value!r}")
    for key in value:
        if key not in known:
            raise ValueError(f"hardware {source!r}: field {name + '.' if name else ''}{key}: unknown; expected one "
                             f"of {', '.join(known)}")
    for key in required:
        if key not in value:
            raise ValueError(f"hardware {source!r}: field {name + '.' if name else ''}{key}: missing")
    return value


def hardware_from_dict(data: Any, source: str = "<dict>") -> Hardware:
    """A Hardware from the YAML mapping (format in the module doc).

    Raises:
        ValueError: a missing, unknown or bad field (the message names `source` and the field).
    """
    required = ("peak_tflops", "memory_GB", "memory_bandwidth_GBps", "levels", "efficiency")
    data = _mapping(source, "", data, _TOP_KEYS, required)
    name = data.get("name", os.path.splitext(os.path.basename(source))[0])
    if not isinstance(name, str) or not name:
        raise ValueError(f"hardware {source!r}: field 'name': expected a non-empty string, got {name!r}")
    levels_raw = data["levels"]
    if not isinstance(levels_raw, list) or not levels_raw:
        raise ValueError(f"hardware {source!r}: field 'levels': expected a non-empty list of levels")
    levels = []
    for i, raw in enumerate(levels_raw):
        where = f"levels[{i}]"
        raw = _mapping(source, where, raw, _LEVEL_KEYS, _LEVEL_KEYS)
        devices = raw["devices"]
        if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
            raise ValueError(f"hardware {source!r}: field '{where}.devices': expected an int >= 1, got {devices!r}")
        if levels and (devices <= levels[-1].devices or devices % levels[-1].devices):
            raise ValueError(f"hardware {source!r}: field '{where}.devices': {devices} must be a multiple of and "
                             f"larger than the level below ({levels[-1].devices})")
        if not isinstance(raw["name"], str):
            raise ValueError(f"hardware {source!r}: field '{where}.name': expected a string, got {raw['name']!r}")
        bandwidth = _number(source, f"{where}.bandwidth_GBps", raw["bandwidth_GBps"]) * 1e9
        latency = _number(source, f"{where}.latency_us", raw["latency_us"], inclusive_low=True) * 1e-6
        levels.append(Level(raw["name"], devices, bandwidth, latency))
    eff = _mapping(source, "efficiency", data["efficiency"], _EFFICIENCY_KEYS, _EFFICIENCY_REQUIRED)
    efficiency = Efficiency(*(_number(source, f"efficiency.{k}", eff[k], high=1.0) for k in ("matmul", "memory",
                                                                                              "network")),
                            _number(source, "efficiency.message_overhead_us", eff["message_overhead_us"],
                                    inclusive_low=True) * 1e-6,
                            _number(source, "efficiency.op_overhead_us", eff.get("op_overhead_us", 0),
                                    inclusive_low=True) * 1e-6,
                            _number(source, "efficiency.peer_wait_us", eff.get("peer_wait_us", 0),
                                    inclusive_low=True) * 1e-6,
                            None if eff.get("attention") is None else
                            _number(source, "efficiency.attention", eff["attention"], high=1.0))
    attention = data.get("attention", "flash")
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"hardware {source!r}: field 'attention': expected one of {', '.join(ATTENTION_KERNELS)}, "
                         f"got {attention!r}")
    if efficiency.attention is not None and attention != "flash":
        raise ValueError(f"hardware {source!r}: field 'efficiency.attention': the flash kernel's efficiency, but "
                         f"'attention' is {attention!r} (its attention core is timed as GEMMs at the matmul factor); "
                         f"remove it or set attention: flash")
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError(f"hardware {source!r}: field 'sources': expected a mapping of field -> citation text")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ValueError(f"hardware {source!r}: field 'description': expected a string, got {description!r}")
    kernels = data.get("kernels", {})
    if not isinstance(kernels, dict):
        raise ValueError(f"hardware {source!r}: field 'kernels': expected a mapping of op key -> [forward_us, "
                         f"backward_us]")
    for key, pair in kernels.items():
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"hardware {source!r}: field 'kernels.{key}': expected [forward_us, backward_us]")
        for side, value in zip(("forward_us", "backward_us"), pair):
            _number(source, f"kernels.{key}.{side}", value, inclusive_low=True)
    sharing = None
    if "core_sharing" in data:
        raw = _mapping(source, "core_sharing", data["core_sharing"], _CORE_SHARING_KEYS + _CORE_SHARING_OPTIONAL,
                       _CORE_SHARING_KEYS)
        try:
            sharing = CoreSharing(**raw)
        except ValueError as exc:
            raise ValueError(f"hardware {source!r}: field {exc}") from None
    tiling = None
    if "gemm_tiling" in data:
        raw = _mapping(source, "gemm_tiling", data["gemm_tiling"], _GEMM_TILING_KEYS + _GEMM_TILING_OPTIONAL,
                       _GEMM_TILING_KEYS)
        l2 = raw.get("l2_bandwidth_GBps")
        try:
            tiling = GemmTiling(raw["sms"], raw["tiles"], None if l2 is None else _number(
                source, "gemm_tiling.l2_bandwidth_GBps", l2) * 1e9)
        except ValueError as exc:
            raise ValueError(f"hardware {source!r}: field {exc}") from None
    allocator = _mapping(source, "allocator", data.get("allocator", {}), _ALLOCATOR_KEYS, ())
    alignment = allocator.get("alignment_bytes", POOL_ALIGNMENT_BYTES)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"hardware {source!r}: field 'allocator.alignment_bytes': expected an int >= 1, "
                         f"got {alignment!r}")
    fragmentation = _number(source, "allocator.fragmentation", allocator.get("fragmentation", 0.0), high=1.0,
                            inclusive_low=True)
    validated = data.get("validated")
    if validated is not None and (not isinstance(validated, str) or not validated.strip()):
        raise ValueError(f"hardware {source!r}: field 'validated': expected a non-empty string (the published runs "
                         f"the factors were checked against, or \"unvalidated\"), got {validated!r}")
    return Hardware(name=name, peak_flops=_number(source, "peak_tflops", data["peak_tflops"]) * 1e12,
                    memory_bytes=int(_number(source, "memory_GB", data["memory_GB"]) * 1e9),
                    memory_bandwidth=_number(source, "memory_bandwidth_GBps", data["memory_bandwidth_GBps"]) * 1e9,
                    levels=tuple(levels), efficiency=efficiency, attention=attention, description=description,
                    sources=dict(sources),
                    kernels={k: (float(f) * 1e-6, float(b) * 1e-6) for k, (f, b) in kernels.items()},
                    core_sharing=sharing, validated=validated, gemm_tiling=tiling,
                    allocator_alignment=alignment, fragmentation=fragmentation)
