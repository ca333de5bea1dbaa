"""Multimodal helpers: an asynchronous encoder pipeline and an LSH feature cache (docs/multimodal.md)."""
from mindspore_hyper.multimodal.encoder_pipeline import AsyncEncoderPipeline, PipelineResult, TrainResult
from mindspore_hyper.multimodal.feature_cache import CacheMatch, CacheStats, FeatureCache
from mindspore_hyper.multimodal.requests import Batch, EncodedBatch
from mindspore_hyper.multimodal.signature import image_signature, signature_dim
from mindspore_hyper.multimodal.timeline import PipelineTimeline, StageEvent

__all__ = ["AsyncEncoderPipeline", "PipelineResult", "TrainResult", "Batch", "EncodedBatch", "PipelineTimeline",
           "StageEvent", "FeatureCache", "CacheStats", "CacheMatch", "image_signature", "signature_dim"]
