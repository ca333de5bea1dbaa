"""Hot-expert cache: experts' weights in HyperOffload's tiered store, the device tier holding
the experts the router uses most.

Each expert's weights are tensors in an `offload.OffloadStore` whose device tier has room for
`capacity` experts (the rest live in host DRAM, or on disk when DRAM is full). A step brings in
the experts the router chose, in expert order (as a layer runs them); an expert not in the
device tier is a *cold fetch*. The eviction order is the store's: lower priority first, then
least recently used. With `policy="routing"` each expert's priority is its rank in an
exponential moving average of the routing counts (`observe`), so hot experts stay resident;
`policy="lru"` leaves every priority equal (plain LRU, which a sweep over more experts than fit
turns into misses on every step).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Union

import numpy as np

__all__ = ["HotExpertCache", "ExpertCacheConfig", "CACHE_POLICIES"]

CACHE_POLICIES = ("routing", "lru")

ExpertWeights = Union[np.ndarray, Sequence[np.ndarray]]


@dataclass(frozen=True)
class ExpertCacheConfig:
    """How an offloaded MoE layer's experts are cached (`OffloadPolicy.expert_cache`).

    Args:
        policy: "routing" (priorities from routing statistics) or "lru" (plain LRU).
        capacity: experts the device tier holds; None: every expert of the layer. A step must
            not route to more experts than this (they are all on the device tier at once).
        decay: weight of the past in the moving average of the routing counts, in [0, 1).

    Raises:
        ValueError: an unknown policy, a capacity < 1 or a decay outside [0, 1).
    """

    policy: str = "routing"
    capacity: Optional[int] = None
    decay: float = 0.8

    def __post_init__(self):
        if self.policy not in CACHE_POLICIES:
            raise ValueError(f"expert_cache.policy={self.policy!r}: expected one of {', '.join(map(repr, CACHE_POLICIES))}")
        if self.capacity is not None and (isinstance(self.capacity, bool) or not isinstance(self.capacity, int)
                                          or self.capacity < 1):
            raise ValueError(f"expert_cache.capacity={self.capacity!r}: expected an int >= 1 (experts on the device "
                             "tier) or None (all experts)")
        if not 0.0 <= self.decay < 1.0:
            raise ValueError(f"expert_cache.decay={self.decay!r}: expected a number in [0, 1)")

    @classmethod
    def from_context(cls) -> "ExpertCacheConfig":
        """The context flags `moe_cache_policy` and `moe_cache_capacity` (0: every expert)."""
        from mindspore_hyper.context import get_context

        capacity = get_context("moe_cache_capacity")
        return cls(policy=get_context("moe_cache_policy"), capacity=capacity or None)


class HotExpertCache:
    """Experts' weights in a tiered store (see module docstring).

    Args:
        weights: per expert, its weights: one numpy array, or a list of arrays (e.g. its w_gate,
            w_up, w_down slices); every expert the same shapes.
        capacity: experts the device tier holds.
        policy: "routing" (priority hints from routing statistics) or "lru".
        decay: weight of the past in the moving average of the routing counts.
        block_size: bytes per store block (default: an expert's size rounded up to 4 KiB).
        extra_bytes_per_expert: host-tier room each expert needs beyond its weights, in blocks of
            its own (e.g. its optimizer states, stored after `store.close_pack()`).

    Raises:
        ValueError: an unknown policy, capacity out of 1..experts, or experts of different shapes.
    """

    def __init__(self, weights: Sequence[ExpertWeights], capacity: int, policy: str = "routing", decay: float = 0.8,
                 block_size: int = None, extra_bytes_per_expert: int = 0):
        from mindspore_hyper.offload.store import OffloadStore

        if policy not in CACHE_POLICIES:
            raise ValueError(f"HotExpertCache: policy={policy!r}; expected 'routing' or 'lru'")
        if not 1 <= capacity <= len(weights):
            raise ValueError(f"HotExpertCache: capacity={capacity} must be in 1..{len(weights)} experts")
        self._single = isinstance(weights[0], np.ndarray)
        experts = [[np.asarray(w)] if isinstance(w, np.ndarray) else [np.asarray(a) for a in w] for w in weights]
        shapes = {tuple((a.shape, a.dtype.str) for a in w) for w in experts}
        if len(shapes) != 1:
            raise ValueError(f"HotExpertCache: experts have different sizes {sorted(shapes)}")
        # each tensor starts 64-byte aligned in the expert's blocks
        expert_bytes = sum(-(-a.nbytes // 64) * 64 for a in experts[0])
        block = block_size or -(-expert_bytes // 4096) * 4096
        per_expert = -(-expert_bytes // block)
        extra_blocks = len(experts) * -(-int(extra_bytes_per_expert) // block)
        self.capacity, self.num_experts = capacity, len(experts)
        self.store = OffloadStore(block_size=block, device_memory=capacity * per_expert * block,
                                  host_memory=(len(experts) * per_expert + extra_blocks + 1) * block, prefetch_depth=0)
        self.refs: List[list] = []
        self.blocks: List[List[int]] = []
        for w in experts:
            self.store.close_pack()  # an expert's tensors share only their own blocks
            refs = [self.store.put(a) for a in w]
            self.refs.append(refs)
            self.blocks.append(sorted({b for r in refs for b in r.blocks}))
        self.store.close_pack()
        for blocks in self.blocks:  # start with nothing resident on the device tier
            for b in blocks:
                self.store.blocks.evict(b, "device")
        self.policy, self.decay = policy, float(decay)
        self.load = np.zeros(len(experts))
        self.cold_fetches = 0
        self.fetches = 0
        self.pinned: List[int] = []

    def observe(self, counts: Sequence[int]) -> None:
        """Routing counts of a step (copies per expert): the moving average behind the priorities."""
        self.load = self.decay * self.load + (1.0 - self.decay) * np.asarray(counts, dtype=np.float64)
        if self.policy == "routing":
            ranks = np.argsort(np.argsort(self.load, kind="stable"), kind="stable")  # 0 = coldest
            for blocks, r in zip(self.blocks, ranks):
                for b in blocks:
                    self.store.blocks.set_priority(b, int(r))

    def resident(self, expert: int) -> bool:
        return all(self.store.blocks.has_valid_copy(b, "device") for b in self.blocks[expert])

    def fetch(self, expert: int) -> Union[np.ndarray, List[np.ndarray]]:
        """The expert's weights, brought to the device tier (a cold fetch if they were not there)."""
        self.fetches += 1
        if not self.resident(expert):
            self.cold_fetches += 1
        self.store.blocks.fetch(self.blocks[expert], "device")
        values = [self.store.get(r) for r in self.refs[expert]]
        return values[0] if self._single else values

    def step(self, experts_used: Sequence[int]) -> Dict[str, float]:
        """Bring in the step's experts in expert order; returns its cold fetches and seconds."""
        cold, start = self.cold_fetches, time.perf_counter()
        for e in sorted(set(int(x) for x in experts_used)):
            self.fetch(e)
        return {"cold_fetches": self.cold_fetches - cold, "seconds": time.perf_counter() - start}

    # -- training: the step's experts pinned on the device tier ---------------------------
    def pin(self, experts: Sequence[int]) -> int:
        """Brings `experts` (sorted, distinct) to the device tier and pins them there until
        `unpin`; returns how many were cold fetches.

        Raises:
            ValueError: more experts than the device tier holds, or experts already pinned.
        """
        if self.pinned:
            raise ValueError(f"HotExpertCache.pin: experts {self.pinned} are still pinned; unpin them first")
        if len(experts) > self.capacity:
            raise ValueError(f"this step routes tokens to {len(experts)} experts but the expert cache's device tier "
                             f"holds capacity={self.capacity}; raise the capacity (ExpertCacheConfig.capacity or the "
                             f"moe_cache_capacity flag) to at least the experts one step uses")
        cold = []
        try:
            for e in experts:  # first the step's resident experts, so fetching the cold ones cannot evict them
                self.fetches += 1
                if not self.hold(e):
                    cold.append(e)
            for e in cold:
                self.store.blocks.fetch(self.blocks[e], "device")
                for b in self.blocks[e]:
                    self.store.blocks.pin(b, "device")
                self.pinned.append(e)
        except BaseException:
            self.unpin()
            raise
        self.pinned.sort()
        self.cold_fetches += len(cold)
        return len(cold)

    def unpin(self) -> None:
        """Releases the pinned experts (they stay on the device tier until evicted)."""
        for e in self.pinned:
            for b in self.blocks[e]:
                self.store.blocks.unpin(b, "device")
        self.pinned = []

    def hold(self, expert: int) -> bool:
        """Pins the expert where it is on the device tier, if it is there and not pinned yet, so
        a `write` updates its device copy in place instead of dropping it; returns whether it
        did (then `let_go` it)."""
        if expert in self.pinned or not self.resident(expert):
            return False
        for b in self.blocks[expert]:
            self.store.blocks.pin(b, "device")
        if not self.resident(expert):  # evicted in between: nothing to keep
            for b in self.blocks[expert]:
                self.store.blocks.unpin(b, "device")
            return False
        self.pinned.append(expert)
        return True

    def let_go(self, expert: int) -> None:
        """Unpins an expert `hold` pinned."""
        self.pinned.remove(expert)
        for b in self.blocks[expert]:
            self.store.blocks.unpin(b, "device")

    def read(self, expert: int, into: Sequence[np.ndarray] = None) -> List[np.ndarray]:
        """The expert's tensors: from its device-tier copy when pinned, else from wherever it
        lives (host DRAM or disk) without moving it."""
        tier = "device" if expert in self.pinned else None
        if into is None:
            return [self.store.get(r, pinned_tier=tier) for r in self.refs[expert]]
        for r, out in zip(self.refs[expert], into):
            self.store.get_into(r, out, pinned_tier=tier)
        return list(into)

    def write(self, expert: int, values: Sequence[np.ndarray]) -> None:
        """New values of the expert's tensors (a new version in the store)."""
        for r, v in zip(self.refs[expert], values):
            self.store.update(r, v)

    def close(self) -> None:
        self.unpin()
        self.store.close()
