"""Hot-expert cache: experts' weights in HyperOffload's tiered store, the device tier holding
the experts the router uses most.

Each expert's weights are one tensor in an `offload.OffloadStore` whose device tier has room for
`capacity` experts (the rest live in host DRAM). A step brings in the experts the router chose,
in expert order (as a layer runs them); an expert not in the device tier is a *cold fetch*. The
eviction order is the store's: lower priority first, then least recently used. With
`policy="routing"` each expert's priority is its rank in an exponential moving average of the
routing counts (`observe`), so hot experts stay resident; `policy="lru"` leaves every priority
equal (plain LRU, which a sweep over more experts than fit turns into misses on every step).
"""
from __future__ import annotations

import time
from typing import Dict, Sequence

import numpy as np

__all__ = ["HotExpertCache"]


class HotExpertCache:
    """Experts' weights in a tiered store (see module docstring).

    Args:
        weights: per expert, its weights as one numpy array (e.g. w_gate, w_up, w_down raveled
            and concatenated); all the same size.
        capacity: experts the device tier holds.
        policy: "routing" (priority hints from routing statistics) or "lru".
        decay: weight of the past in the moving average of the routing counts.
        block_size: bytes per store block (default: an expert's size rounded up to 4 KiB).

    Raises:
        ValueError: an unknown policy, capacity out of 1..experts, or experts of different sizes.
    """

    def __init__(self, weights: Sequence[np.ndarray], capacity: int, policy: str = "routing", decay: float = 0.8,
                 block_size: int = None):
        from mindspore_hyper.offload.store import OffloadStore

        if policy not in ("routing", "lru"):
            raise ValueError(f"HotExpertCache: policy={policy!r}; expected 'routing' or 'lru'")
        if not 1 <= capacity <= len(weights):
            raise ValueError(f"HotExpertCache: capacity={capacity} must be in 1..{len(weights)} experts")
        sizes = {np.asarray(w).nbytes for w in weights}
        if len(sizes) != 1:
            raise ValueError(f"HotExpertCache: experts have different sizes {sorted(sizes)}")
        expert_bytes = sizes.pop()
        block = block_size or -(-expert_bytes // 4096) * 4096
        per_expert = -(-expert_bytes // block)
        self.store = OffloadStore(block_size=block, device_memory=capacity * per_expert * block,
                                  host_memory=(len(weights) + 1) * per_expert * block, prefetch_depth=0)
        self.refs = []
        for w in weights:
            self.store.close_pack()
            self.refs.append(self.store.put(np.asarray(w)))
        for ref in self.refs:  # start with nothing resident on the device tier
            for b in ref.blocks:
                self.store.blocks.evict(b, "device")
        self.policy, self.decay = policy, float(decay)
        self.load = np.zeros(len(weights))
        self.cold_fetches = 0
        self.fetches = 0

    def observe(self, counts: Sequence[int]) -> None:
        """Routing counts of a step (copies per expert): the moving average behind the priorities."""
        self.load = self.decay * self.load + (1.0 - self.decay) * np.asarray(counts, dtype=np.float64)
        if self.policy == "routing":
            ranks = np.argsort(np.argsort(self.load, kind="stable"), kind="stable")  # 0 = coldest
            for ref, r in zip(self.refs, ranks):
                for b in ref.blocks:
                    self.store.blocks.set_priority(b, int(r))

    def resident(self, expert: int) -> bool:
        return all(self.store.blocks.has_valid_copy(b, "device") for b in self.refs[expert].blocks)

    def fetch(self, expert: int) -> np.ndarray:
        """The expert's weights, brought to the device tier (a cold fetch if they were not there)."""
        ref = self.refs[expert]
        self.fetches += 1
        if not self.resident(expert):
            self.cold_fetches += 1
        self.store.blocks.fetch(list(ref.blocks), "device")
        return self.store.get(ref)

    def step(self, experts_used: Sequence[int]) -> Dict[str, float]:
        """Bring in the step's experts in expert order; returns its cold fetches and seconds."""
        cold, start = self.cold_fetches, time.perf_counter()
        for e in sorted(set(int(x) for x in experts_used)):
            self.fetch(e)
        return {"cold_fetches": self.cold_fetches - cold, "seconds": time.perf_counter() - start}

    def close(self) -> None:
        self.store.close()
