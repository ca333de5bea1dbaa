"""Developer tools that drive the runtimes but are not part of the training API.

`coverage`: the op and layer sweeps that write docs/op_coverage.md.
"""
