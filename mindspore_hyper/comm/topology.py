"""Cluster topologies for the communication library: presets and YAML files.

A topology is a set of devices and bidirectional links with a latency and a bandwidth. The C++
core computes lowest-latency paths (a path's bandwidth is its narrowest hop), orders rings
through a group (nearest device first, then 2-opt), and groups devices into clusters (nodes)
for hierarchical algorithms when the links are not uniform.

Presets (`Topology.preset(name, num_devices=None)`; names as in ``context.TOPOLOGY_PRESETS``):

* ``supernode384``: 384 devices, a uniform full-mesh fabric, 200 ns per hop and 15x the
  conventional 25 GB/s (375 GB/s) -- the seed's supernode.
* ``node8``: nodes of 8 devices (full mesh inside, 1 us, 56 GB/s) joined by slower links
  (10 us, 12.5 GB/s); 16 devices (2 nodes) unless `num_devices` says otherwise.
* ``ring``: each device linked to its two neighbours (1 us, 25 GB/s); 8 devices by default.

YAML format (every field optional except the device count, which may come from `nodes`)::

    name: my_cluster
    devices: 16                  # number of devices
    node_size: 8                 # or nodes: [[0, 1, ...], [8, 9, ...]]
    intra_node: {latency_ns: 1000, bandwidth_GBps: 56}    # full mesh inside each node
    inter_node: {latency_ns: 10000, bandwidth_GBps: 12.5} # every pair of devices across nodes
    mesh: {latency_ns: 200, bandwidth_GBps: 375}          # full mesh over all devices
    ring: {latency_ns: 1000, bandwidth_GBps: 25}          # device i <-> i+1 (mod devices)
    links:                                                # explicit links
      - {src: 0, dst: 1, latency_ns: 200, bandwidth_GBps: 375}

Latency may be given as ``latency_ns``, ``latency_us`` or ``latency_s``; bandwidth as
``bandwidth_GBps`` (gigabytes/s) or ``bandwidth_Bps``. Errors name the file and the field.

A network given as levels of domains (`levels.Level`, the estimator's hardware files) becomes a
topology with `Topology.from_levels`. `read_yaml` is the one reader of these network files
(topologies here, hardware in `estimate.hardware`).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

from mindspore_hyper._resources import resource_path
from mindspore_hyper.comm._common import _C
from mindspore_hyper.comm.levels import Level

__all__ = ["Topology", "load_topology", "read_yaml", "PRESETS"]

PRESETS = ("supernode384", "node8", "ring")
_CONFIG_DIR = resource_path("topologies")  # the example YAML files; shipped in the package


class Topology:
    """Devices and links; a thin wrapper over the C++ topology (``self.cpp``)."""

    def __init__(self, cpp):
        self.cpp = cpp

    # ----- construction ---------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, num_devices: Optional[int] = None) -> "Topology":
        """A preset by name (``supernode384``, ``node8``, ``ring``); see the module doc."""
        if name not in PRESETS:
            raise ValueError(f"topology preset {name!r} unknown; presets: {', '.join(PRESETS)}")
        if num_devices is not None and (not isinstance(num_devices, int) or num_devices <= 0):
            raise ValueError(f"num_devices={num_devices!r}: expected a positive int")
        return cls(_C.Topology.preset(name, num_devices or 0))

    @classmethod
    def from_links(cls, name: str, num_devices: int, links: Sequence[tuple],
                   node_of: Optional[Sequence[int]] = None) -> "Topology":
        """From explicit (a, b, latency_s, bandwidth_Bps) links."""
        t = _C.Topology(name, int(num_devices), list(node_of or []))
        for a, b, lat, bw in links:
            t.add_link(int(a), int(b), float(lat), float(bw))
        return cls(t)

    @classmethod
    def from_levels(cls, levels: Sequence[Level], num_devices: Optional[int] = None,
                    name: str = "levels") -> "Topology":
        """The device graph of a network of levels: every pair of devices linked at the innermost
        level whose domain holds both (its latency and bandwidth); the level-0 domains are the
        nodes (clusters) when there are several levels.

        Args:
            levels: innermost first, each domain size dividing the next.
            num_devices: devices of the graph (default: the largest domain's).
            name: the topology's name.

        Raises:
            ValueError: `num_devices` is not a positive int or exceeds the largest domain.
        """
        n = levels[-1].devices if num_devices is None else num_devices
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= levels[-1].devices:
            raise ValueError(f"num_devices={num_devices!r}: expected an int in [1, {levels[-1].devices}]")
        links = []
        for a in range(n):
            for b in range(a + 1, n):
                level = next(lv for lv in levels if a // lv.devices == b // lv.devices)
                links.append((a, b, level.latency, level.bandwidth))
        node_of = [d // levels[0].devices for d in range(n)] if len(levels) > 1 else None
        return cls.from_links(name, n, links, node_of)

    @classmethod
    def from_yaml(cls, path: str) -> "Topology":
        """Load a topology file (format in the module doc). Errors name the file and the field."""
        return cls.from_dict(read_yaml(path, "topology"), source=path)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<dict>") -> "Topology":
        def fail(field: str, msg: str):
            raise ValueError(f"topology {source!r}: field {field!r}: {msg}")

        if not isinstance(data, dict):
            raise ValueError(f"topology {source!r}: expected a mapping at the top level, got {type(data).__name__}")
        known = {"name", "devices", "node_size", "nodes", "intra_node", "inter_node", "mesh", "ring", "links"}
        for key in data:
            if key not in known:
                fail(str(key), f"unknown field; known fields: {', '.join(sorted(known))}")
        name = data.get("name", os.path.splitext(os.path.basename(source))[0])
        if not isinstance(name, str):
            fail("name", f"expected a string, got {name!r}")

        nodes = data.get("nodes")
        n = data.get("devices")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n <= 0):
            fail("devices", f"expected a positive int, got {n!r}")
        if nodes is not None:
            if not isinstance(nodes, list) or not all(isinstance(x, list) for x in nodes):
                fail("nodes", "expected a list of device-id lists")
            flat = [d for node in nodes for d in node]
            for i, node in enumerate(nodes):
                for j, d in enumerate(node):
                    if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                        fail(f"nodes[{i}][{j}]", f"expected a device id (int >= 0), got {d!r}")
            if len(set(flat)) != len(flat):
                fail("nodes", "a device appears in more than one node")
            if n is None:
                n = max(flat) + 1 if flat else 0
            if sorted(flat) != list(range(n)):
                fail("nodes", f"must cover devices 0..{n - 1} exactly once")
            node_of = [0] * n
            for i, node in enumerate(nodes):
                for d in node:
                    node_of[d] = i
        else:
            if n is None:
                fail("devices", "missing (the number of devices, or give 'nodes')")
            node_of = []
            if "node_size" in data:
                size = data["node_size"]
                if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                    fail("node_size", f"expected a positive int, got {size!r}")
                node_of = [d // size for d in range(n)]

        def link_params(field: str, spec: Any):
            if not isinstance(spec, dict):
                fail(field, f"expected a mapping with latency and bandwidth, got {spec!r}")
            lat = None
            for key, scale in (("latency_ns", 1e-9), ("latency_us", 1e-6), ("latency_s", 1.0)):
                if key in spec:
                    v = spec[key]
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                        fail(f"{field}.{key}", f"expected a number >= 0, got {v!r}")
                    lat = float(v) * scale
            if lat is None:
                fail(field, "missing latency (latency_ns, latency_us or latency_s)")
            bw = None
            for key, scale in (("bandwidth_GBps", 1e9), ("bandwidth_Bps", 1.0)):
                if key in spec:
                    v = spec[key]
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                        fail(f"{field}.{key}", f"expected a positive number, got {v!r}")
                    bw = float(v) * scale
            if bw is None:
                fail(field, "missing bandwidth (bandwidth_GBps or bandwidth_Bps)")
            return lat, bw

        links: Dict[tuple, tuple] = {}

        def put(a: int, b: int, params):
            links[(min(a, b), max(a, b))] = params

        if "mesh" in data:
            p = link_params("mesh", data["mesh"])
            for a in range(n):
                for b in range(a + 1, n):
                    put(a, b, p)
        if "ring" in data:
            p = link_params("ring", data["ring"])
            for a in range(n):
                if n > 1 and a != (a + 1) % n:
                    put(a, (a + 1) % n, p)
        if "intra_node" in data or "inter_node" in data:
            if not node_of:
                fail("intra_node" if "intra_node" in data else "inter_node", "needs 'nodes' or 'node_size'")
            intra = link_params("intra_node", data["intra_node"]) if "intra_node" in data else None
            inter = link_params("inter_node", data["inter_node"]) if "inter_node" in data else None
            for a in range(n):
                for b in range(a + 1, n):
                    same = node_of[a] == node_of[b]
                    if same and intra:
                        put(a, b, intra)
                    if not same and inter:
                        put(a, b, inter)
        explicit = data.get("links", [])
        if not isinstance(explicit, list):
            fail("links", "expected a list of {src, dst, latency_*, bandwidth_*} mappings")
        for i, spec in enumerate(explicit):
            field = f"links[{i}]"
            if not isinstance(spec, dict):
                fail(field, f"expected a mapping, got {spec!r}")
            for key in ("src", "dst"):
                v = spec.get(key)
                if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                    fail(f"{field}.{key}", f"expected a device id in [0, {n}), got {v!r}")
            if spec["src"] == spec["dst"]:
                fail(field, "links a device to itself")
            put(spec["src"], spec["dst"], link_params(field, spec))
        if n > 1 and not links:
            fail("links", "the topology has no links (give mesh, ring, intra_node/inter_node or links)")
        topo = cls.from_links(name, n, [(a, b, lat, bw) for (a, b), (lat, bw) in sorted(links.items())], node_of)
        for d in range(1, n):  # every device reachable
            try:
                topo.cpp.latency(0, d)
            except _C.CommError as exc:
                raise ValueError(f"topology {source!r}: {exc}") from exc
        return topo

    # ----- queries ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.cpp.name

    @property
    def num_devices(self) -> int:
        return self.cpp.num_devices

    @property
    def links(self) -> List[tuple]:
        """(a, b, latency_s, bandwidth_Bps) per link."""
        return self.cpp.links

    def node_of(self, device: int) -> int:
        return self.cpp.node_of(device)

    def path(self, a: int, b: int) -> dict:
        """Lowest-latency path: {'latency_s', 'bandwidth_Bps', 'devices'}."""
        return self.cpp.path(a, b)

    def ring_order(self, devices: Sequence[int]) -> List[int]:
        return self.cpp.ring_order(list(devices))

    def is_uniform(self, devices: Optional[Sequence[int]] = None, tolerance: float = 1.5) -> bool:
        return self.cpp.is_uniform(list(range(self.num_devices)) if devices is None else list(devices), tolerance)

    def clusters(self, devices: Optional[Sequence[int]] = None) -> List[List[int]]:
        return self.cpp.clusters(list(range(self.num_devices)) if devices is None else list(devices))

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, devices={self.num_devices}, links={len(self.links)})"


def read_yaml(path: str, what: str) -> Any:
    """The content of the YAML file `path` (a topology or hardware file).

    Args:
        path: the file.
        what: what the file holds, for errors ("topology", "hardware").

    Raises:
        ValueError: the file cannot be read or is not YAML (names `what` and the file).
    """
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as exc:
        raise ValueError(f"{what} file {path!r}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} file {path!r}: invalid YAML ({exc})") from None


def load_topology(spec: Any = None, num_devices: Optional[int] = None) -> Topology:
    """A Topology from a preset name, a YAML path, a Topology, or (None) the context flag `topology`."""
    if isinstance(spec, Topology):
        return spec
    if spec is None:
        from mindspore_hyper.context import get_context

        spec = get_context("topology")
    if isinstance(spec, str) and spec in PRESETS:
        return Topology.preset(spec, num_devices)
    if isinstance(spec, str) and spec.endswith((".yaml", ".yml")):
        return Topology.from_yaml(spec)
    raise ValueError(f"topology={spec!r}: expected a preset ({', '.join(PRESETS)}), a .yaml path or a Topology")
