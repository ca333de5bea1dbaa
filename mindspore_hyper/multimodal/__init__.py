"""Multimodal helpers: an asynchronous encoder pipeline and an LSH feature cache (docs/multimodal.md)."""
from mindspore_hyper.multimodal.encoder_pipeline import AsyncEncoderPipeline
from mindspore_hyper.multimodal.feature_cache import CacheMatch, CacheStats, FeatureCache
from mindspore_hyper.multimodal.requests import Batch, EncodedBatch
from mindspore_hyper.multimodal.results import PipelineResult, TrainResult
from mindspore_hyper.multimodal.signature import image_signature, signature_dim
from mindspore_hyper.multimodal.encoder_timeline import EncoderTimeline, stage_span

__all__ = ["AsyncEncoderPipeline", "PipelineResult", "TrainResult", "Batch", "EncodedBatch", "EncoderTimeline",
           "stage_span", "FeatureCache", "CacheStats", "CacheMatch", "image_signature", "signature_dim"]
