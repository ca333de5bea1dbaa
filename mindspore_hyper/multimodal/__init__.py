"""Multimodal helpers: an asynchronous encoder pipeline and an LSH feature cache (docs/multimodal.md)."""
from mindspore_hyper.multimodal.feature_cache import CacheMatch, CacheStats, FeatureCache
from mindspore_hyper.multimodal.signature import image_signature, signature_dim

__all__ = ["FeatureCache", "CacheStats", "CacheMatch", "image_signature", "signature_dim"]
