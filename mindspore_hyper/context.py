"""Package-wide feature flags: `set_context`, `get_context`, `reset_context`.

Precedence for every flag: a value given to `set_context` > the environment variable
`MS_HYPER_<FLAG>` (upper case) > the default. Values are validated when set (and when read
from the environment), so a bad value fails early with the flag's name and what is allowed.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

__all__ = [
    "set_context",
    "get_context",
    "reset_context",
    "parse_bytes",
    "FLAGS",
    "TOPOLOGY_PRESETS",
    "apply_host_dispatch",
    "HOST_BLOCKING_ENV",
]

MODES = ("simulation", "distributed", "native", "dryrun")
# the modes whose ops MindSpore dispatches one by one on the host (the CPU modes): `host_dispatch`
# acts on them. Read before MindSpore's first op, so before any Runtime (runtime/) can be imported.
HOST_DISPATCH_MODES = ("simulation", "distributed")
TOPOLOGY_PRESETS = ("supernode384", "node8", "ring")
MEMORY_CHECKS = ("warn", "error")
SIM_COLLECTIVES = ("mindspore", "library")
MOE_ROUTINGS = ("learned", "balanced")
DIST_TRANSPORTS = ("shm", "mindspore", "hybrid")
HOST_DISPATCH = ("inline", "async")
CPU_BINDINGS = ("auto", "none")
CPU_BFLOAT16 = ("mindspore", "emulate")
# MindSpore reads it once, at its first op: "1" runs each op on the calling thread
HOST_BLOCKING_ENV = "MS_DEV_HOST_BLOCKING_RUN"

_UNITS = {  # SI units are decimal (1 GB = 10^9 bytes), IEC units binary (1 GiB = 2^30 bytes)
    "": 1, "B": 1,
    "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
    "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

KB, MB, GB = 1 << 10, 1 << 20, 1 << 30


def parse_bytes(value: Any, name: str = "value") -> int:
    """Parse a byte count: an int, or a string such as "64GiB", "512MiB", "4KiB" (binary units, as
    every report prints them) or "64GB", "512MB" (decimal: 1 GB = 10^9 bytes, as the SI says).

    Args:
        value: int bytes or a size string.
        name: the argument name used in the error message.

    Returns:
        The size in bytes.

    Raises:
        ValueError: the value is not a non-negative size.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected a byte size (int or string like '512MB')")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{name}={value!r}: a byte size must be >= 0")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match and match.group(2).upper() in _UNITS:
            number = float(match.group(1)) * _UNITS[match.group(2).upper()]
            if number != int(number):
                raise ValueError(f"{name}={value!r}: not a whole number of bytes")
            return int(number)
    raise ValueError(
        f"{name}={value!r}: expected a byte size, an int or a string like '64GiB', '512MiB', '4KiB' "
        f"(binary) or '64GB' (decimal, 10^9 bytes)"
    )


def _format_bytes(n: int) -> str:
    for unit, size in (("GiB", GB), ("MiB", MB), ("KiB", KB)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _parse_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={value!r}: expected a bool (True/False, or '1'/'0' from the environment)")


def _choice(choices: Tuple[str, ...]) -> Callable[[Any, str], str]:
    def parse(value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}")
        return value
    return parse


def _int_range(low: int, high: int) -> Callable[[Any, str], int]:
    def parse(value: Any, name: str) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name}={value!r}: expected an int in [{low}, {high}]")
        return value
    return parse


def _bytes_range(low: int, high: int) -> Callable[[Any, str], int]:
    def parse(value: Any, name: str) -> int:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        n = parse_bytes(value, name)
        if not low <= n <= high:
            raise ValueError(
                f"{name}={value!r}: expected a size between {_format_bytes(low)} and {_format_bytes(high)}"
            )
        return n
    return parse


def _fraction(low: float, high: float) -> Callable[[Any, str], float]:
    def parse(value: Any, name: str) -> float:
        try:
            number = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            number = None
        if number is None or not low <= number <= high:
            raise ValueError(f"{name}={value!r}: expected a fraction in [{low:g}, {high:g}]")
        return number
    return parse


def _moe_routing(value: Any, name: str):
    """"learned", "balanced", or a routing histogram: the fraction of token copies each expert
    receives (non-negative numbers summing to 1, one per expert; from the environment a
    comma-separated list), kept as a tuple of floats. Its length is checked against the MoE
    layer's expert count when a router uses it (`moe.router.histogram_choice`)."""
    if isinstance(value, str) and value in MOE_ROUTINGS:
        return value
    expected = (f"{name}={value!r}: expected one of {', '.join(map(repr, MOE_ROUTINGS))} or a routing histogram: "
                "a list of the fraction of token copies each expert receives, numbers >= 0 summing to 1")
    if isinstance(value, str) and "," in value:
        try:
            value = [float(v) for v in value.split(",")]
        except ValueError:
            raise ValueError(expected) from None
    if not isinstance(value, (list, tuple)) or not value or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise ValueError(expected)
    fractions = tuple(float(v) for v in value)
    if any(not math.isfinite(f) or f < 0 for f in fractions):
        raise ValueError(f"{expected}; got a negative or non-finite fraction")
    if abs(sum(fractions) - 1.0) > 1e-6:  # fractions written with a few decimals sum to 1 within rounding
        raise ValueError(f"{expected}; they sum to {sum(fractions):.9g}")
    return fractions


def _topology(value: Any, name: str) -> str:
    if isinstance(value, str) and value in TOPOLOGY_PRESETS:
        return value
    if isinstance(value, str) and value.endswith((".yaml", ".yml")):
        if not os.path.isfile(value):
            raise ValueError(f"{name}={value!r}: topology file does not exist")
        return value
    raise ValueError(
        f"{name}={value!r}: expected a preset ({', '.join(TOPOLOGY_PRESETS)}) or a path to a .yaml file"
    )


def _seconds(low: float, high: float) -> Callable[[Any, str], float]:
    def parse(value: Any, name: str) -> float:
        try:
            seconds = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            seconds = None
        if seconds is None or not low <= seconds <= high:
            raise ValueError(f"{name}={value!r}: expected a number of seconds in [{low:g}, {high:g}]")
        return seconds
    return parse


def _directory(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: expected a directory path string ('' = system temp dir)")
    return value


def _default_mode() -> str:
    """Simulation on CPU; MindSpore's native auto-parallel where an accelerator is the target.

    Inside `mindspore.DeviceCtx("meta")` (MindFormers 2.0 lays its models out there) the target
    reads "meta", a device of shapes only: the mode follows the device the block was entered from.

    Raises:
        ValueError: the target is "meta" outside any `DeviceCtx` block (set the mode explicitly).
    """
    import mindspore as ms

    target = ms.get_context("device_target")
    if target == "meta":
        from mindspore.common.device import _DEVICE_STACK  # DeviceCtx's stack of the devices it left

        outside = [d.device_target for d in _DEVICE_STACK.get_stack() if d.device_target != "meta"]
        if not outside:
            raise ValueError("mode: MindSpore's device target is 'meta' (shapes only) outside any DeviceCtx block, "
                             "so the default mode cannot follow it; set mode explicitly (set_context(mode=...) or "
                             "MS_HYPER_MODE)")
        target = outside[-1]
    return "simulation" if target == "CPU" else "native"


@dataclass(frozen=True)
class Flag:
    """One context flag: its parser/validator, default and a one-line description."""

    name: str
    parse: Callable[[Any, str], Any]
    default: Any
    doc: str

    @property
    def env_var(self) -> str:
        return f"MS_HYPER_{self.name.upper()}"

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.parse(self.default, self.name)


FLAGS: Dict[str, Flag] = {f.name: f for f in (
    Flag("mode", _choice(MODES), _default_mode,
         "execution mode: simulation (N virtual devices in one process), distributed (msrun), native, "
         "dryrun (N devices, shapes and bytes only)"),
    Flag("device_num", _int_range(1, 1 << 20), 8, "virtual devices in simulation mode"),
    Flag("device_memory", _bytes_range(1, 1 << 50), "64GiB", "per-device memory capacity in bytes"),
    Flag("host_memory", _bytes_range(1, 1 << 50), "32GiB", "host DRAM pool capacity of the offload store"),
    Flag("offload_dir", _directory, "", "directory of the offload store's disk tier ('' = system temp)"),
    Flag("memory_check", _choice(MEMORY_CHECKS), "warn",
         "what simulation does when a device exceeds device_memory: warn or error"),
    Flag("allocator_alignment", _int_range(1, 1 << 20), 512,
         "report's step peak with the allocator's rounding: every block rounded up to this many bytes (MindSpore's "
         "memory pool: 512; `--hardware` sets the preset's)"),
    Flag("allocator_fragmentation", _fraction(0.0, 1.0), 0.0,
         "report's step peak with a fragmentation allowance: the rounded peak times (1 + this fraction)"),
    Flag("moe_routing", _moe_routing, "learned",
         "MoE routers: learned (each token's top-k by its logits), balanced (token t's j-th choice is expert "
         "(t k + j) mod E: equal loads, what the dry run, which has no logits, assumes by default) or a histogram "
         "(a list of the fraction of token copies each expert receives, summing to 1: every device's tokens are "
         "routed by it, in every mode)"),
    Flag("sim_collectives", _choice(SIM_COLLECTIVES), "mindspore",
         "simulation collectives: differentiable MindSpore ops, or the C++ communication library"),
    Flag("host_dispatch", _choice(HOST_DISPATCH), "inline",
         "simulation and distributed modes: MindSpore runs each op on the calling thread (inline) instead of "
         "handing it to its dispatch threads (async), which spin while they wait and, where processes share "
         "the cores, cost about as much CPU as the ops; acts if the mode is known before MindSpore's first op"),
    Flag("cpu_binding", _choice(CPU_BINDINGS), "auto",
         "distributed mode (shm and hybrid transports): bind each process of a host to its own cores "
         "(a block each, or one core round robin when processes outnumber cores) unless a launcher "
         "bound it already; none leaves the scheduler free"),
    Flag("cpu_bfloat16", _choice(CPU_BFLOAT16), "mindspore",
         "simulation and distributed modes on the CPU: ops whose MindSpore CPU kernel lacks bfloat16 fail as "
         "MindSpore's do (mindspore), or run on float32 copies with outputs rounded to bfloat16 (emulate)"),
    Flag("sim_synchronize", _parse_bool, True,
         "simulation: launch MindSpore kernels synchronously (mindspore.runtime.launch_blocking), much cheaper for many small ops"),
    Flag("hyper_offload", _parse_bool, False, "enable HyperOffload (tiered parameter/activation store)"),
    Flag("cache_block_size", _bytes_range(MB, GB), "128MiB", "offload cache-block size in bytes"),
    Flag("prefetch_depth", _int_range(1, 64), 4, "blocks the prefetch scheduler keeps in flight"),
    Flag("offload_worker_nice", _int_range(0, 19), 19,
         "nice value of the offload's background threads (I/O, host updates, writes): they yield the cores to the compute"),
    Flag("moe_cache_policy", _choice(("routing", "lru")), "routing",
         "hyper_offload of MoE layers: the hot-expert cache's eviction priorities, routing statistics or plain LRU"),
    Flag("moe_cache_capacity", _int_range(0, 1 << 20), 0,
         "hyper_offload of MoE layers: experts each layer keeps on the device tier (0 = all of them)"),
    Flag("hyper_mpmd", _parse_bool, False, "enable HyperMPMD (different programs on device groups)"),
    Flag("comm_aggregation_bytes", _bytes_range(KB, GB), "4MiB",
         "super-packet size of the communication aggregator in bytes"),
    Flag("topology", _topology, "node8", "cluster topology: a preset name or a YAML file path"),
    Flag("dist_transport", _choice(DIST_TRANSPORTS), "shm",
         "distributed mode's transport: shm (shared memory, one host), mindspore (MindSpore communication, "
         "several hosts) or hybrid (shared memory for groups within one host, MindSpore's between hosts)"),
    Flag("comm_timeout", _seconds(0.1, 86400.0), 120.0,
         "distributed mode: seconds without progress before a collective fails with CommTimeout"),
)}

_explicit: Dict[str, Any] = {}


def _check_name(name: str) -> Flag:
    if name not in FLAGS:
        raise ValueError(f"unknown context flag {name!r}; known flags: {', '.join(sorted(FLAGS))}")
    return FLAGS[name]


def set_context(**flags: Any) -> None:
    """Set one or more flags; all are validated before any is applied.

    Args:
        **flags: flag names and values, e.g. ``mode="simulation", device_num=8, device_memory="64GiB"``.

    Raises:
        ValueError: an unknown flag name or a value outside what the flag allows.
    """
    parsed = {}
    for name, value in flags.items():
        flag = _check_name(name)
        parsed[name] = flag.parse(value, name)
    _explicit.update(parsed)
    if "mode" in parsed or "host_dispatch" in parsed:
        get_context("mode")  # applies host_dispatch to the mode


def get_context(name: Optional[str] = None) -> Any:
    """Return one flag's value, or a dict of all flags when `name` is None.

    Raises:
        ValueError: an unknown flag name, or an invalid value in its environment variable.
    """
    if name is None:
        return {n: get_context(n) for n in FLAGS}
    flag = _check_name(name)
    if name in _explicit:
        value = _explicit[name]
    else:
        env = os.environ.get(flag.env_var)
        value = flag.parse(env, flag.env_var) if env is not None else flag.default_value()
    if name == "mode":
        apply_host_dispatch(value)
    return value


def apply_host_dispatch(mode: Optional[str]) -> None:
    """Ask MindSpore for inline op dispatch in the CPU modes (flag host_dispatch); a value the user
    set in MindSpore's own variable stays. Acts only before MindSpore's first op in the process."""
    if mode in HOST_DISPATCH_MODES and get_context("host_dispatch") == "inline":
        os.environ.setdefault(HOST_BLOCKING_ENV, "1")


def reset_context() -> None:
    """Forget every value given to `set_context` (environment variables and defaults apply again)."""
    _explicit.clear()


try:  # a mode set in the environment: before MindSpore's first op
    apply_host_dispatch(os.environ.get(FLAGS["mode"].env_var))
except ValueError:  # a bad MS_HYPER_HOST_DISPATCH: the first read of the mode names it
    pass
