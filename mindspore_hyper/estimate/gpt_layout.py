"""The parallel config (YAML mapping) that lays out examples/models.py's GPT as a JobStrategy says.

Megatron tensor parallelism by parameter name: qkv and fc1 column parallel (weight rows and bias
split), proj and fc2 row parallel (weight columns split, bias replicated), the token embedding and
the LM head split by vocabulary rows, norms and the position table replicated. Pipeline stages
over the `blocks.*` Cells; ZeRO-1 as optimizer-state sharding along "data"; ZeRO-3 adds "data"
to every parameter's map (the first dimension the tensor axis leaves free, else shared with it).
Every parameter gets an explicit `parameter_level` entry, which wins over the pipeline entry.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["gpt_parallel_config", "GPT_TENSOR_MAPS"]

TensorMap = Tuple[Optional[str], ...]

# parameter-name pattern -> tensor map under tensor parallelism (trailing dimensions unsplit)
GPT_TENSOR_MAPS: Dict[str, TensorMap] = {
    "embed.embedding_table": ("tensor", None),
    "pos.embedding_table": (None, None),
    "blocks.*.ln1.*": (None,),
    "blocks.*.attn.qkv.weight": ("tensor", None),
    "blocks.*.attn.qkv.bias": ("tensor",),
    "blocks.*.attn.proj.weight": (None, "tensor"),
    "blocks.*.attn.proj.bias": (None,),
    "blocks.*.ln2.*": (None,),
    "blocks.*.fc1.weight": ("tensor", None),
    "blocks.*.fc1.bias": ("tensor",),
    "blocks.*.fc2.weight": (None, "tensor"),
    "blocks.*.fc2.bias": (None,),
    "ln_f.*": (None,),
    "head.weight": ("tensor", None),
}


def _with_data(tmap: TensorMap) -> List:
    """Add the "data" axis to a map: on the first dimension left free, else beside "tensor" on dim 0."""
    out = list(tmap)
    for i, entry in enumerate(out):
        if entry is None:
            out[i] = "data"
            return out
    out[0] = (out[0], "data")
    return out


def gpt_parallel_config(strategy: JobStrategy) -> dict:
    """A `parallel_config` mapping (for `auto_parallelize` / `load_parallel_config`) of the GPT.

    Args:
        strategy: data / tensor / pipeline sizes and the ZeRO stage; the other fields do not
            change where parameters live.

    Returns:
        The mapping, with mesh (data, tensor, pipeline).

    Raises:
        ValueError: ZeRO-2 (the simulation lays gradients out like parameters, so it has no
            ZeRO-2), sequence or expert parallelism (not expressible for this model).
    """
    if strategy.zero_stage == 2:
        raise ValueError("zero_stage=2 has no simulation layout: the simulation's gradients are laid out like "
                         "the parameters (use 1 for sharded optimizer states, 3 for sharded parameters too)")
    if strategy.sequence_parallel or strategy.expert > 1:
        raise ValueError("the GPT layout covers data, tensor and pipeline parallelism and ZeRO 0/1/3; "
                         "sequence_parallel and expert are not expressible for it")
    parameters = []
    for name, tmap in GPT_TENSOR_MAPS.items():
        entry: List = [e if strategy.tensor > 1 else None for e in tmap]
        if strategy.zero_stage == 3:
            entry = _with_data(tuple(entry))
        parameters.append({"name": name, "tensor_map": entry})
    config = {
        "device_matrix": [strategy.data, strategy.tensor, strategy.pipeline],
        "alias_names": ["data", "tensor", "pipeline"],
        "optimizer": {"sharding": strategy.zero_stage >= 1},
        "parameter_level": parameters,
    }
    if strategy.pipeline > 1:
        config["module_level"] = [{"name": "blocks.*", "strategy": {"pipeline": strategy.pipeline}}]
    return {"parallel_config": config}
