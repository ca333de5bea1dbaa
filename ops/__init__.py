"""MindSpore custom ops of mindspore_hyper (installed as ``mindspore_hyper.ops``)."""
from mindspore_hyper.ops.offload_ops import StoreFetch, StorePut, store_fetch, store_put
from mindspore_hyper.ops.routing_ops import PackRouting, UnpackRouting

__all__ = ["StoreFetch", "StorePut", "store_fetch", "store_put", "PackRouting", "UnpackRouting"]
