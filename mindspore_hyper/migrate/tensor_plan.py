"""`tensor_parallel_plan(model, prefix="") -> TensorPlan`: Megatron column/row-parallel splits of a torch model's
Linear layers as YAML `module_level` / `parameter_level` entries on the torch module names, so that the converted
Cell (whose Cell names are the torch names) runs under `auto_parallelize` with a `tensor` axis as converted.

Where the splits come from:

1. transformers' own tensor-parallel plan, `model.config.base_model_tp_plan` (keys relative to the base model,
   `model.base_model_prefix`), when the config has one that splits some Linear. Column-like styles (colwise,
   colwise_gather_output, unit_colwise) split a Linear's output features, row-like ones (rowwise,
   rowwise_split_input, packed_rowwise) its input features; the other styles (embeddings, MLA's shared latent
   projection, expert-local and replicated parameters) have no Linear split here and are listed in
   `TensorPlan.replicated`.
2. Otherwise (no plan, or one naming only embeddings: DiffLlama, gpt-oss, LFM2) name rules on the Linear-like
   modules (torch.nn.Linear, and transformers' Conv1D, whose weight is (in, out)) inside the repeated layer lists
   (the children of an nn.ModuleList): the projections into attention and into the MLP's hidden units are
   column-parallel, the projections out of them row-parallel (NAME_RULES).

The Linears inside a sparse MoE block that `convert` maps to `mindspore_hyper.moe.MoE` (its shared expert's)
are left whole and listed: the MoE Cell names them otherwise.

A column-parallel Linear's bias is split with its outputs; a row-parallel one's is replicated (it is added after
the partial products are summed). Simulation is exact for any layout, so the plan decides only how sensible the
sharding is, not whether the result is right.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["TensorPlan", "tensor_parallel_plan", "COLUMN", "ROW"]

COLUMN, ROW = "column", "row"
# transformers tp_plan styles -> the split they amount to on a Linear; the others are left whole (the reason)
STYLES = {"colwise": COLUMN, "colwise_gather_output": COLUMN, "unit_colwise": COLUMN,
          "rowwise": ROW, "rowwise_split_input": ROW, "packed_rowwise": ROW}
KEPT_WHOLE = {
    "embedding_rowwise": "an embedding (vocabulary-parallel lookup is not planned)",
    "embedding_colwise": "an embedding (vocabulary-parallel lookup is not planned)",
    "mla_kv_a_proj": "MLA's shared latent projection (replicated: every head reads all of it)",
    "replicated_with_grad_allreduce": "replicated by the plan itself",
    "replicate": "replicated by the plan itself",
    "local_params": "local parameters (no Linear split)",
    "moe_tp_experts": "expert weights (split by expert parallelism, not here)",
    "packed_colwise": "packed projections (a contiguous split would cut across the packed parts)",
}
# name rules (source 2): the end of a Linear's name inside a layer -> its role; longer (dotted) ends first
NAME_RULES: Tuple[Tuple[str, str], ...] = (
    # BERT-likes, ViT, wav2vec2: attention.output.dense and output.dense consume the attention / intermediate
    ("attention.output.dense", ROW), ("intermediate.dense", COLUMN), ("output.dense", ROW),
    # GPT-NeoX / Falcon / Bloom: the attention's output projection is called `dense`
    ("attention.dense", ROW), ("self_attention.dense", ROW), ("attn.dense", ROW),
    ("ff.layer_1", COLUMN), ("ff.layer_2", ROW),  # XLNet's feed-forward
    *((n, COLUMN) for n in ("query", "key", "value", "q", "k", "v", "q_proj", "k_proj", "v_proj", "qkv", "qkv_proj",
                            "Wqkv", "in_proj", "c_attn", "q_attn", "query_key_value", "gate_proj", "up_proj",
                            "gate_up_proj", "c_fc", "fc1", "wi", "wi_0", "wi_1", "dense_h_to_4h", "w1", "w3", "lin1",
                            "q_lin", "k_lin", "v_lin", "intermediate_dense", "fc_in")),
    *((n, ROW) for n in ("o", "o_proj", "out_proj", "c_proj", "wo", "fc2", "dense_4h_to_h", "down_proj", "w2",
                         "lin2", "out_lin", "output_dense", "fc_out")),
)


@dataclass(frozen=True)
class TensorPlan:
    """A tensor-parallel plan for one torch model, ready for a YAML parallel config.

    Attributes:
        module_level: `{"name": pattern, "strategy": {"tensor": (a, b)}}` entries on the torch module names
            (prefixed): (tensor, 1) splits a weight's first dimension, (1, tensor) its second.
        parameter_level: `{"name": pattern, "tensor_map": [...]}` entries for the 1-D biases of the planned
            Linears: ["tensor"] (column-parallel) or [None] (row-parallel, replicated).
        source: "transformers tp_plan" or "module names".
        replicated: (plan entry or module name, why it is left whole) pairs.
        tensor: the tensor-axis size the split counts are written for.
    """

    module_level: Tuple[Dict[str, Any], ...]
    parameter_level: Tuple[Dict[str, Any], ...]
    source: str
    replicated: Tuple[Tuple[str, str], ...]
    tensor: int = 2

    def parallel_config(self, data: int = 1) -> Dict[str, Any]:
        """The YAML config (as a dict) of a `data` x `tensor` mesh with this plan's entries.

        Args:
            data: size of the data axis (>= 1).

        Returns:
            {"parallel_config": {"device_matrix": [data, tensor], "alias_names": ["data", "tensor"], ...}}.

        Raises:
            ValueError: `data` is not a positive int.
        """
        if not isinstance(data, int) or isinstance(data, bool) or data < 1:
            raise ValueError(f"parallel_config: data must be a positive int (the data-axis size), got {data!r}")
        return {"parallel_config": {"device_matrix": [data, self.tensor], "alias_names": ["data", "tensor"],
                                    "module_level": [dict(e) for e in self.module_level],
                                    "parameter_level": [dict(e) for e in self.parameter_level]}}

    def to_yaml(self) -> str:
        """The plan as the `module_level` / `parameter_level` part of a YAML parallel config, with the replicated
        entries as comments."""
        lines = [f"# tensor-parallel plan from {self.source} (tensor axis of {self.tensor})", "module_level:"]
        for e in self.module_level:
            split = ", ".join(map(str, e["strategy"]["tensor"]))
            lines.append(f"  - {{name: \"{e['name']}\", strategy: {{tensor: ({split})}}}}")
        lines.append("parameter_level:" if self.parameter_level else "parameter_level: []")
        for e in self.parameter_level:
            tmap = ", ".join("None" if t is None else t for t in e["tensor_map"])
            lines.append(f"  - {{name: \"{e['name']}\", tensor_map: [{tmap}]}}")
        lines += [f"# left whole: {name}: {why}" for name, why in self.replicated]
        return "\n".join(lines) + "\n"


def tensor_parallel_plan(model, prefix: str = "", tensor: int = 2) -> TensorPlan:
    """Megatron column/row-parallel splits of `model`'s Linear layers on its torch module names.

    Args:
        model: a torch.nn.Module (a transformers model or any module with Linear layers in nn.ModuleLists).
        prefix: prepended to every module name, e.g. "model." when the converted Cell wraps `model` as `.model`.
        tensor: size of the tensor axis (>= 2); a Linear whose split dimension it does not divide stays whole.

    Returns:
        The TensorPlan (its module_level is empty when nothing can be split, e.g. a conv net).

    Raises:
        TypeError: `model` is not a torch.nn.Module, or `prefix` not a str.
        ValueError: `tensor` is not an int >= 2.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"tensor_parallel_plan: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"tensor_parallel_plan: prefix must be a str (prepended to the module names), got "
                        f"{type(prefix).__name__}")
    if not isinstance(tensor, int) or isinstance(tensor, bool) or tensor < 2:
        raise ValueError(f"tensor_parallel_plan: tensor must be an int >= 2 (the tensor-axis size), got {tensor!r}")
    modules = dict(model.named_modules())
    moe = _moe_blocks(modules)
    linear = {n: _linear_dims(m) for n, m in modules.items()
              if n and _linear_dims(m) is not None and not _inside(n, moe)}
    tp_plan = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    roles, replicated = _from_tp_plan(model, tp_plan, modules, linear, prefix)
    source = "transformers tp_plan"
    if not roles:  # no plan, or one that splits no Linear (some list only the embedding): the name rules
        source = "module names"
        replicated = [(name, f"{why} (transformers tp_plan, which splits no Linear here)") for name, why in replicated]
        layered = _in_layer_lists(modules)
        for name in linear:
            if name not in layered:
                continue
            role = _role_by_name(name)
            if role is None:
                replicated.append((prefix + name, "no column/row name rule matches it"))
            else:
                roles[name] = role
    for name in list(roles):
        first, second = linear[name]  # the weight's (out, in), or (in, out) for Conv1D
        size = first if (roles[name] == COLUMN) != _transposed(modules[name]) else second
        if size % tensor:
            replicated.append((prefix + name, f"{roles[name]}-parallel split of {size} features by {tensor}: "
                                              f"not divisible"))
            del roles[name]
    replicated += [(prefix + n + ".*", "inside a sparse MoE block that converts to mindspore_hyper.moe.MoE (its "
                    "Cells are named otherwise: split its experts by expert parallelism, its shared expert by "
                    "overrides on `moe.shared.*`)") for n in moe]
    module_level, parameter_level = _entries(roles, modules, prefix, tensor)
    return TensorPlan(tuple(module_level), tuple(parameter_level), source, tuple(_folded(replicated)), tensor)


def _moe_blocks(modules: Dict[str, Any]) -> List[str]:
    """Names of the sparse MoE blocks `convert` maps to mindspore_hyper.moe.MoE (moe_blocks.recognize)."""
    from mindspore_hyper.migrate.moe_blocks import recognize

    return [n for n, m in modules.items() if n and recognize(m) is not None]


def _inside(name: str, blocks: List[str]) -> bool:
    return any(name.startswith(f"{b}.") for b in blocks)


def _from_tp_plan(model, tp_plan: Dict[str, str], modules: Dict[str, Any], linear, prefix: str):
    """(module name -> role, [(pattern, why left whole)]) from transformers' tp_plan. Its keys are relative to the
    base model: `model.base_model_prefix` where that is a submodule, else the child (or the model itself) whose
    names the most keys match (Llama 4's prefix says `language_model`, its module is `model`)."""
    named = [n for n in modules if n]
    stated = getattr(model, "base_model_prefix", "")
    candidates = ([stated] if stated in modules and stated else []) + [n for n in named if "." not in n] + [""]

    def matches(base: str) -> int:
        head = f"{base}." if base else ""
        return sum(any(fnmatch.fnmatchcase(n, head + key) for n in named) for key in tp_plan)
    base = max(candidates, key=matches) if tp_plan else ""
    base = f"{base}." if base else ""
    roles: Dict[str, str] = {}
    replicated: List[Tuple[str, str]] = []
    for key, style in tp_plan.items():
        pattern = base + key
        matched = [n for n in named if fnmatch.fnmatchcase(n, pattern)]
        role = STYLES.get(style)
        if role is None:
            why = KEPT_WHOLE.get(style, "a style with no Linear split")
            replicated.append((prefix + pattern, f"{style}: {why}"))
        elif not matched:
            replicated.append((prefix + pattern, f"{style}: matches no module"))
        elif not any(n in linear for n in matched) and any(n in modules and _linear_dims(modules[n]) for n in matched):
            replicated.append((prefix + pattern, f"{style}: inside a sparse MoE block (converted to "
                                                 "mindspore_hyper.moe.MoE)"))
        elif not any(n in linear for n in matched):
            kind = type(modules[matched[0]]).__name__
            replicated.append((prefix + pattern, f"{style}: matches no Linear ({kind})"))
        else:
            roles.update({n: role for n in matched if n in linear})
    return roles, replicated


def _linear_dims(module) -> Optional[Tuple[int, int]]:
    """The 2-D weight's shape of an nn.Linear or transformers Conv1D (by class name: any Conv1D with `nf`), else
    None."""
    import torch

    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    if isinstance(module, torch.nn.Linear) or _transposed(module):
        return tuple(weight.shape)
    return None


def _transposed(module) -> bool:
    """transformers' Conv1D (GPT-2 style): weight (in, out)."""
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _in_layer_lists(modules: Dict[str, Any]) -> set:
    """Names of the modules under an item of an nn.ModuleList (the repeated layers)."""
    import torch

    lists = [n for n, m in modules.items() if isinstance(m, torch.nn.ModuleList)]
    found = set()
    for name in modules:
        for lst in lists:
            head = f"{lst}." if lst else ""
            if name.startswith(head) and re.match(r"\d+\.", name[len(head):]):
                found.add(name)
                break
    return found


def _role_by_name(name: str) -> Optional[str]:
    for end, role in NAME_RULES:
        if name == end or name.endswith("." + end):
            return role
    return None


def _fold(name: str) -> str:
    return re.sub(r"(?<=\.)\d+(?=\.|$)|^\d+(?=\.|$)", "*", name)


def _folded(items: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    return list(dict.fromkeys((_fold(n), why) for n, why in items))


def _entries(roles: Dict[str, str], modules: Dict[str, Any], prefix: str, tensor: int):
    """module_level / parameter_level entries giving each planned Linear its split: layer indices folded to `*`
    where that is unambiguous over every parameter name (last match wins, as the config resolves), else the
    Linears' own names."""
    params = dict(_named_parameters(modules))
    folded: Dict[str, Tuple[str, str]] = {}  # pattern -> (role, one module it names)
    for name, role in roles.items():
        folded.setdefault(_fold(name), (role, name))
    unambiguous = all(folded[_fold(n)][0] == r for n, r in roles.items())
    if not (unambiguous and _resolves_to({p: r for p, (r, _) in folded.items()}, roles, params)):
        folded = {n: (r, n) for n, r in roles.items()}
    module_level, parameter_level = [], []
    for pattern, (role, example) in folded.items():
        column_dim = 1 if _transposed(modules[example]) else 0  # the weight's output-features dimension
        split = [1, 1]
        split[column_dim if role == COLUMN else 1 - column_dim] = tensor
        module_level.append({"name": prefix + pattern, "strategy": {"tensor": tuple(split)}})
        if any(fnmatch.fnmatchcase(n, pattern + ".bias") for n in params):
            parameter_level.append({"name": prefix + pattern + ".bias",
                                    "tensor_map": ["tensor"] if role == COLUMN else [None]})
    return module_level, parameter_level


def _named_parameters(modules):
    for name, module in modules.items():
        for leaf, p in module.named_parameters(recurse=False):
            yield (f"{name}.{leaf}" if name else leaf), p


def _resolves_to(patterns: Dict[str, str], roles: Dict[str, str], params) -> bool:
    """Whether the patterns, matched as the config matches them (`P.*` on parameter names, last match wins),
    give every parameter of a planned Linear its role and touch no other parameter."""
    owner = {}
    for pname in params:
        module = pname.rsplit(".", 1)[0]
        owner[pname] = roles.get(module)
    for pname, want in owner.items():
        got = None
        for pattern, role in patterns.items():
            if fnmatch.fnmatchcase(pname, pattern + ".*"):
                got = role
        if got != want:
            return False
    return True
