"""FeatureCache: reuse encoder features of near-duplicate images, found by SimHash LSH.

Each of `num_tables` hash tables draws `bits_per_table` random hyperplanes (Charikar's SimHash);
a signature's key in a table is the bit pattern of the signs of its projections. Two signatures
at angle t share a table's key with probability (1 - t/pi)^bits, so near-duplicates meet in some
table with high probability while unrelated images rarely do. LSH only proposes candidates: a
candidate is reused only if the exact cosine of the two signatures is >= `threshold`, so an image
is never answered with the feature of an image below the threshold (a missed near-duplicate costs
an encoder run, never a wrong answer). Entries are evicted least recently used beyond `capacity`.
Features may live in an `OffloadStore` (its host DRAM / disk tiers) while the signatures and
tables stay in memory.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional

import numpy as np

__all__ = ["FeatureCache", "CacheStats", "CacheMatch"]


@dataclass
class CacheStats:
    """Counters of a FeatureCache.

    Attributes:
        hits: lookups answered with a cached feature.
        misses: lookups answered with None.
        candidates_checked: LSH candidates whose exact cosine was computed.
        rejected: lookups with candidates, none of them at or above the threshold.
        inserts: entries added.
        evictions: entries dropped for capacity (least recently used first).
    """

    hits: int = 0
    misses: int = 0
    candidates_checked: int = 0
    rejected: int = 0
    inserts: int = 0
    evictions: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def to_dict(self) -> Dict[str, float]:
        return {"hits": self.hits, "misses": self.misses, "candidates_checked": self.candidates_checked,
                "rejected": self.rejected, "inserts": self.inserts, "evictions": self.evictions,
                "hit_rate": self.hit_rate}


@dataclass(frozen=True)
class CacheMatch:
    """A reused entry: its feature, the exact cosine with the query, and the key given at insert."""

    feature: np.ndarray
    similarity: float
    key: Any


@dataclass
class _Entry:
    signature: np.ndarray
    hashes: tuple
    feature: Any  # np.ndarray, or a TensorRef into the offload store
    key: Any = field(default=None)


def _positive_int(name: str, value, upper: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"{name}: expected at most {upper}, got {value}")
    return int(value)


class FeatureCache:
    """SimHash LSH cache from image signatures to encoder features.

    Args:
        dim: signature length (e.g. `signature_dim(16)` = 256).
        num_tables: hash tables; more tables find more near-duplicates (higher recall) and check
            more candidates.
        bits_per_table: hyperplanes per table (1..62); more bits make buckets more selective.
        threshold: exact cosine a candidate must reach to be reused, in (0, 1].
        capacity: entries kept; the least recently used one is evicted beyond it.
        seed: seed of the hyperplanes.
        store: an `mindspore_hyper.offload.OffloadStore` holding the features (its DRAM / disk
            tiers, for caches larger than host memory wants to hold); None keeps them in memory.

    Raises:
        ValueError: an argument out of range (the message names it).
    """

    def __init__(self, dim: int, num_tables: int = 8, bits_per_table: int = 10, threshold: float = 0.95,
                 capacity: int = 4096, seed: int = 0, store=None):
        self.dim = _positive_int("dim", dim)
        if self.dim < 2:
            raise ValueError(f"dim: expected >= 2, got {dim}")
        self.num_tables = _positive_int("num_tables", num_tables)
        self.bits_per_table = _positive_int("bits_per_table", bits_per_table, upper=62)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.floating)) \
                or not 0.0 < float(threshold) <= 1.0:
            raise ValueError(f"threshold: expected a cosine similarity in (0, 1], got {threshold!r}")
        self.threshold = float(threshold)
        self.capacity = _positive_int("capacity", capacity)
        if store is not None and not (hasattr(store, "put") and hasattr(store, "get") and hasattr(store, "erase")):
            raise ValueError(f"store: expected an OffloadStore (put/get/erase), got {type(store).__name__}")
        self.store = store
        rng = np.random.default_rng(seed)
        self._planes = rng.standard_normal((self.num_tables * self.bits_per_table, self.dim))
        self._weights = (1 << np.arange(self.bits_per_table, dtype=np.int64))
        self._tables: List[Dict[int, set]] = [dict() for _ in range(self.num_tables)]
        self._entries: "OrderedDict[int, _Entry]" = OrderedDict()
        self._next_id = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    # -- hashing ---------------------------------------------------------------------------
    def _normalised(self, signature) -> Optional[np.ndarray]:
        if hasattr(signature, "asnumpy"):
            signature = signature.asnumpy()
        sig = np.asarray(signature, dtype=np.float64)
        if sig.shape != (self.dim,):
            raise ValueError(f"signature: expected shape ({self.dim},), got {sig.shape}")
        if not np.all(np.isfinite(sig)):
            raise ValueError("signature: contains NaN or infinite values")
        norm = np.linalg.norm(sig)
        return None if norm == 0.0 else sig / norm

    def _hashes(self, sig: np.ndarray) -> tuple:
        bits = (self._planes @ sig > 0).reshape(self.num_tables, self.bits_per_table)
        return tuple(int(v) for v in bits.astype(np.int64) @ self._weights)

    # -- queries ---------------------------------------------------------------------------
    def match(self, signature) -> Optional[CacheMatch]:
        """The most similar cached entry at or above the threshold, or None (counted in stats).

        Raises:
            ValueError: the signature's shape is not (dim,) or it has non-finite values.
        """
        sig = self._normalised(signature)
        if sig is None:  # a constant image: nothing to compare
            self.stats.misses += 1
            return None
        candidates = set()
        for table, h in zip(self._tables, self._hashes(sig)):
            candidates.update(table.get(h, ()))
        best_id, best = None, -2.0
        if candidates:
            ids = sorted(candidates)
            similarities = np.stack([self._entries[i].signature for i in ids]) @ sig
            k = int(np.argmax(similarities))
            best_id, best = ids[k], float(similarities[k])
        self.stats.candidates_checked += len(candidates)
        if best_id is None or best < self.threshold:
            self.stats.misses += 1
            self.stats.rejected += bool(candidates)
            return None
        self.stats.hits += 1
        self._entries.move_to_end(best_id)
        entry = self._entries[best_id]
        feature = self.store.get(entry.feature) if self.store is not None else entry.feature.copy()
        return CacheMatch(feature, best, entry.key)

    def lookup(self, signature) -> Optional[np.ndarray]:
        """The cached feature of a near-duplicate (cosine >= threshold), or None."""
        found = self.match(signature)
        return None if found is None else found.feature

    def insert(self, signature, feature, key: Hashable = None) -> bool:
        """Caches `feature` (copied) under `signature`; `key` comes back in `CacheMatch.key`.

        Returns:
            False for an all-zero signature (a constant image, never matched), else True.

        Raises:
            ValueError: bad signature, or a feature that is not a numeric array.
        """
        sig = self._normalised(signature)
        if hasattr(feature, "asnumpy"):
            feature = feature.asnumpy()
        feature = np.asarray(feature)
        if feature.dtype.kind not in "fiub":
            raise ValueError(f"feature: expected a numeric array, got dtype {feature.dtype}")
        if sig is None:
            return False
        while len(self._entries) >= self.capacity:
            self._evict()
        hashes = self._hashes(sig)
        stored = self.store.put(feature) if self.store is not None else feature.copy()
        entry_id = self._next_id
        self._next_id += 1
        self._entries[entry_id] = _Entry(sig, hashes, stored, key)
        for table, h in zip(self._tables, hashes):
            table.setdefault(h, set()).add(entry_id)
        self.stats.inserts += 1
        return True

    def _evict(self) -> None:
        self._remove(*self._entries.popitem(last=False))
        self.stats.evictions += 1

    def _remove(self, entry_id: int, entry: _Entry) -> None:
        for table, h in zip(self._tables, entry.hashes):
            bucket = table[h]
            bucket.discard(entry_id)
            if not bucket:
                del table[h]
        if self.store is not None:
            self.store.erase(entry.feature)

    def clear(self) -> None:
        """Drops every entry (not counted as evictions; stats are kept)."""
        while self._entries:
            self._remove(*self._entries.popitem(last=False))
