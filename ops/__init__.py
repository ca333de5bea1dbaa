"""MindSpore custom ops of mindspore_hyper (installed as ``mindspore_hyper.ops``)."""
from mindspore_hyper.ops.offload_ops import StoreFetch, StorePut, store_fetch, store_put

__all__ = ["StoreFetch", "StorePut", "store_fetch", "store_put"]
