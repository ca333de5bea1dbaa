"""FeatureCache: near-duplicates found, nothing below the threshold ever reused, LRU, store backing."""
import numpy as np
import pytest

from mindspore_hyper.multimodal import FeatureCache, image_signature, signature_dim
from mindspore_hyper.multimodal.synthetic import blend, random_image, reencode, shift

DIM = signature_dim(16)


def _images(n, seed=0, side=48):
    rng = np.random.default_rng(seed)
    return [random_image(rng, side, side) for _ in range(n)], rng


def _filled_cache(images, **kwargs):
    cache = FeatureCache(DIM, **kwargs)
    for i, image in enumerate(images):
        assert cache.insert(image_signature(image), np.full(4, i, np.float32), key=i)
    return cache


def test_reencoded_and_shifted_images_reuse_their_original_feature():
    images, rng = _images(40)
    cache = _filled_cache(images, threshold=0.95)
    found = 0
    for i, image in enumerate(images):
        variants = [reencode(image, rng, gain=rng.uniform(0.8, 1.2), offset=rng.uniform(-0.05, 0.05)),
                    shift(image, int(rng.integers(-1, 2)), int(rng.integers(-1, 2)))]
        for variant in variants:
            match = cache.match(image_signature(variant))
            if match is not None:
                found += 1
                assert match.key == i and np.array_equal(match.feature, np.full(4, i, np.float32))
                assert match.similarity >= 0.95
    assert found >= 0.9 * 2 * len(images)  # recall of the default tables (docs/multimodal.md)
    assert cache.stats.hits == found and cache.stats.misses == 2 * len(images) - found


def test_distinct_images_miss():
    images, _ = _images(30)
    cache = _filled_cache(images[:15])
    for image in images[15:]:
        assert cache.lookup(image_signature(image)) is None
    assert cache.stats.hits == 0 and cache.stats.misses == 15


def test_near_miss_images_just_below_threshold_are_never_reused():
    images, _ = _images(12, seed=3)
    threshold = 0.95
    cache = _filled_cache(images[:6], threshold=threshold, num_tables=16, bits_per_table=4)
    checked_near_misses = 0
    for i in range(6):
        base = image_signature(images[i])
        # the blend of image i with another one whose signature cosine is closest below the threshold
        alphas = np.linspace(0.0, 0.6, 241)
        sims = np.array([base @ image_signature(blend(images[i], images[6 + i], a)) for a in alphas])
        below = np.flatnonzero(sims < threshold)
        near = blend(images[i], images[6 + i], alphas[below[0]])
        sim = float(base @ image_signature(near))
        assert threshold - 0.01 < sim < threshold
        before = cache.stats.candidates_checked
        match = cache.match(image_signature(near))
        assert match is None or (match.key != i and match.similarity >= threshold)
        checked_near_misses += cache.stats.candidates_checked > before
    assert checked_near_misses >= 4  # the near misses did reach the exact check (same buckets)


def test_adversarial_signatures_in_the_same_buckets_just_below_threshold_miss():
    rng = np.random.default_rng(5)
    cache = FeatureCache(DIM, num_tables=4, bits_per_table=8, threshold=0.9)
    stored = rng.standard_normal(DIM)
    stored /= np.linalg.norm(stored)
    cache.insert(stored, np.ones(3, np.float32), key="stored")
    for target in (0.9 - 1e-6, 0.9 - 1e-3, 0.5):
        # q = c s + sqrt(1 - c^2) u, u orthogonal to s; keep drawing u until q shares a bucket
        for _ in range(10000):
            u = rng.standard_normal(DIM)
            u -= (u @ stored) * stored
            u /= np.linalg.norm(u)
            q = target * stored + np.sqrt(1 - target ** 2) * u
            if set(cache._hashes(q)) & set(cache._entries[0].hashes):
                break
        else:
            pytest.fail("no colliding adversarial signature found")
        before = cache.stats.candidates_checked
        assert cache.lookup(q) is None
        assert cache.stats.candidates_checked == before + 1  # the candidate was checked and refused
    assert cache.stats.rejected == 3
    above = 0.9 + 1e-4
    q = above * stored + np.sqrt(1 - above ** 2) * u
    match = cache.match(q)
    assert match is None or match.key == "stored"


def test_lru_eviction():
    images, _ = _images(3, seed=7)
    sigs = [image_signature(im) for im in images]
    cache = FeatureCache(DIM, capacity=2)
    cache.insert(sigs[0], np.zeros(2), key=0)
    cache.insert(sigs[1], np.zeros(2), key=1)
    assert cache.match(sigs[0]).key == 0  # 0 becomes the most recently used
    cache.insert(sigs[2], np.zeros(2), key=2)  # evicts 1
    assert len(cache) == 2 and cache.stats.evictions == 1
    assert cache.lookup(sigs[1]) is None
    assert cache.match(sigs[0]).key == 0 and cache.match(sigs[2]).key == 2
    cache.clear()
    assert len(cache) == 0 and cache.lookup(sigs[0]) is None and cache.stats.evictions == 1
    assert all(not table for table in cache._tables)


def test_constant_image_never_matches():
    cache = FeatureCache(DIM)
    flat = image_signature(np.full((3, 32, 32), 0.5, np.float32))
    assert not flat.any()
    assert cache.insert(flat, np.ones(2)) is False
    assert cache.lookup(flat) is None and len(cache) == 0


def test_offload_store_backing_spills_to_disk_round_trips_and_erases_evicted():
    from mindspore_hyper.offload.store import OffloadStore

    # host pool of 4 blocks of 4 KiB: features of 4 KiB each beyond the fourth go to the disk tier
    store = OffloadStore(block_size=4096, device_memory=8192, host_memory=16384)
    try:
        images, _ = _images(10, seed=11)
        cache = FeatureCache(DIM, capacity=8, store=store)
        features = [np.random.default_rng(i).standard_normal((32, 32)).astype(np.float32) for i in range(10)]
        for i in range(10):
            cache.insert(image_signature(images[i]), features[i], key=i)
        stats = store.stats()
        assert stats["disk"]["used_blocks"] > 0 and stats["host"]["used_blocks"] <= 4
        assert stats["blocks"] == 8  # the two evicted features were erased from the store
        assert cache.stats.evictions == 2
        assert cache.lookup(image_signature(images[0])) is None and cache.lookup(image_signature(images[1])) is None
        for i in range(2, 10):
            np.testing.assert_array_equal(cache.lookup(image_signature(images[i])), features[i])
    finally:
        store.close()


def test_signature_invariant_to_tone_and_size_independent():
    images, _ = _images(1, seed=2, side=64)
    s = image_signature(images[0])
    assert s.shape == (DIM,) and abs(float(np.linalg.norm(s)) - 1.0) < 1e-5
    assert float(s @ image_signature(images[0] * 0.7 + 0.1)) > 0.9999
    assert image_signature(images[0][0]).shape == (DIM,)  # (H, W) accepted
    assert image_signature(np.zeros((3, 40, 57)) + np.arange(57)).shape == (DIM,)


@pytest.mark.parametrize("kwargs, word", [
    (dict(dim=1), "dim"), (dict(dim=2.5), "dim"), (dict(dim=DIM, num_tables=0), "num_tables"),
    (dict(dim=DIM, bits_per_table=63), "bits_per_table"), (dict(dim=DIM, threshold=0.0), "threshold"),
    (dict(dim=DIM, threshold=1.5), "threshold"), (dict(dim=DIM, capacity=0), "capacity"),
    (dict(dim=DIM, store=object()), "store"),
])
def test_bad_constructor_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        FeatureCache(**kwargs)


def test_bad_signatures_and_features():
    cache = FeatureCache(DIM)
    with pytest.raises(ValueError, match=r"signature: expected shape \(256,\)"):
        cache.lookup(np.ones(10))
    with pytest.raises(ValueError, match="NaN"):
        cache.lookup(np.full(DIM, np.nan))
    with pytest.raises(ValueError, match="feature"):
        cache.insert(np.ones(DIM), np.array(["a"]))
    with pytest.raises(ValueError, match="smaller than"):
        image_signature(np.ones((3, 8, 8)))
    with pytest.raises(ValueError, match=r"\(H, W\) or \(C, H, W\)"):
        image_signature(np.ones((1, 3, 32, 32)))
    with pytest.raises(ValueError, match="size"):
        image_signature(np.ones((32, 32)), size=1)
