"""MindSpore custom ops of mindspore_hyper (installed as ``mindspore_hyper.ops``)."""
