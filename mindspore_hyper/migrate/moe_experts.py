"""Experts modules of transformers' `use_experts_implementation` decorator, computed densely while exporting.

transformers 5 decorates many experts classes (Aria, Ergo, HY-V4, Inkling 2, MiniMax-M3, Nemotron-H, ...) with
`integrations.moe.use_experts_implementation`: their `forward` dispatches on `config._experts_implementation` to
`grouped_mm` (the default: `torch.histc` token counts and `grouped_mm` over data-dependent offsets), `batched_mm`
(one weight matrix gathered per token), or "eager" (the class's own loop over `nonzero()`); none of them can be
exported shape-generally and mapped. The decorator's flags say what the experts compute: `has_gate` (a
`gate_up_proj` whose output goes through `_apply_gate`) or not (`up_proj` and `act_fn`), `is_transposed` (weights
(E, in, out) instead of (E, out, in)), `has_bias`, `has_post_expert_norm`.

While exporting, the implementation the model's config selects is replaced, for the verified modules only, by
`dense_decorated_experts`: every expert on every token, the non-chosen weighted 0 (exact; E / k times the expert
FLOPs), written with the module's own `_apply_gate` / `act_fn`. Subclasses that call the decorated forward through
`super().forward` (Ergo's per-route expert norm) keep their own code around it. A module is computed densely only
after its dense output was checked against the implementation its config selects, on the inputs it received in
one torch run (<= 1e-5 relative, as `moe_blocks.verify_dense`); the others keep the selected implementation (and a
`grouped_mm` one then fails on `aten.histc` with its name).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Dict, Iterator, Optional

import torch

__all__ = ["decorated_experts", "dense_decorated_experts", "verify_decorated", "decorated_dense"]

_DECORATOR_FLAGS = ("has_gate", "has_bias", "is_transposed", "has_post_expert_norm", "_is_expert_parallel")
VERIFY_TOLERANCE = 1e-5  # relative; both sides float32, the same products summed in another order


def _decorated_forward(module: torch.nn.Module) -> Optional[Callable]:
    """The decorator's dispatching forward in `module`'s class hierarchy, or None."""
    for cls in type(module).__mro__:
        forward = cls.__dict__.get("forward")
        code = getattr(forward, "__code__", None)
        if code is not None and code.co_filename.endswith("integrations/moe.py") and hasattr(forward, "__wrapped__"):
            return forward
    return None


def decorated_experts(root: torch.nn.Module, skip: Dict[str, torch.nn.Module]) -> Dict[str, torch.nn.Module]:
    """Modules of `root` (outside `skip`'s paths and their children) whose class is decorated by
    `use_experts_implementation`: path -> module."""
    found = {}
    for path, m in root.named_modules():
        if any(path == p or path.startswith(f"{p}.") for p in skip):
            continue
        if all(hasattr(m, f) for f in _DECORATOR_FLAGS) and hasattr(m, "down_proj") and \
                _decorated_forward(m) is not None:
            found[path] = m
    return found


def _dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], transposed: bool):
    """x [E or 1, T, in] through each expert's weight -> [E, T, out] (weight (E, in, out) when transposed)."""
    out = torch.matmul(x, weight if transposed else weight.transpose(1, 2))
    return out if bias is None else out + bias[:, None, :]


def dense_decorated_experts(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """A decorated experts module's output ([T, H]) for tokens `hidden_states` [T, H] routed to `top_k_index`
    [T, k] with `top_k_weights` [T, k]: every expert on every token, the non-chosen weighted 0. Expert ids outside
    [0, E) (expert-parallel sentinels) match no expert and contribute nothing, as in transformers' kernels."""
    up = self.gate_up_proj if self.has_gate else self.up_proj
    up_bias = (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias) if self.has_bias else None
    num_experts = up.shape[0]
    dtype = hidden_states.dtype
    chosen = (top_k_index[..., None] == torch.arange(num_experts, device=top_k_index.device)).to(dtype)  # [T, k, E]
    weights = (chosen * top_k_weights[..., None].to(dtype)).sum(1)  # [T, E]
    projected = _dense_linear(hidden_states.unsqueeze(0), up, up_bias, self.is_transposed)  # [E, T, O]
    projected = self._apply_gate(projected) if self.has_gate else self.act_fn(projected)
    out = _dense_linear(projected, self.down_proj, self.down_proj_bias if self.has_bias else None,
                        self.is_transposed)  # [E, T, H]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * weights.transpose(0, 1)[:, :, None]).sum(0).to(dtype)


@contextmanager
def _dispatch(modules: Dict[str, torch.nn.Module], choose: Callable) -> Iterator[None]:
    """Inside the body, the decorator's lookup of each module's configured implementation returns
    `choose(module, selected)` for the modules given (`selected`: the function the config selects) and the
    selected function for any other module. Installed as local entries of transformers' ExpertsInterface under
    the configured names, removed afterwards."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    interface = ALL_EXPERTS_FUNCTIONS
    ids = {id(m) for m in modules.values()}
    originals = {}  # name -> the function it selected, for every name the modules' configs use
    for m in modules.values():
        name = m.config._experts_implementation
        if name not in originals:
            default = _decorated_forward(m).__wrapped__  # "eager": the class's own forward
            originals[name] = interface.get(name, default) if name else default
    saved = {n: interface._local_mapping[n] for n in originals if n in interface._local_mapping}

    def dispatching(selected):
        def forward(module, *args, **kwargs):
            if id(module) in ids:
                return choose(module, selected)(module, *args, **kwargs)
            return selected(module, *args, **kwargs)
        return forward
    for name, selected in originals.items():
        interface._local_mapping[name] = dispatching(selected)
    try:
        yield
    finally:
        for name in originals:
            if name in saved:
                interface._local_mapping[name] = saved[name]
            else:
                del interface._local_mapping[name]


def verify_decorated(root: torch.nn.Module, modules: Dict[str, torch.nn.Module], args, kwargs) -> Dict[str, str]:
    """Run `root` once; each module's configured implementation runs, and its dense formulation is computed on the
    same inputs beside it. Returns path -> why, for the modules whose dense output differs (> 1e-5 relative) or
    cannot be computed, and for those never called (they are left as written)."""
    from mindspore_hyper.migrate.lowering import preserved_buffers

    errors: Dict[int, str] = {}
    paths = {id(m): p for p, m in modules.items()}

    def checking(module, selected):
        def forward(mod, *a, **k):
            out = selected(mod, *a, **k)
            try:
                got = dense_decorated_experts(mod, *a, **k)
                scale = float(out.detach().abs().max()) or 1.0
                error = float((got.detach() - out.detach()).abs().max()) / scale
                why = "" if error <= VERIFY_TOLERANCE else \
                    f"its dense formulation differs from its forward ({error:.1e} relative)"
            except Exception as exc:  # noqa: BLE001 - another signature or layout
                why = f"its dense formulation does not apply ({type(exc).__name__}: {exc})"
            errors[id(mod)] = errors.get(id(mod)) or why
            return out
        return forward
    with torch.no_grad(), preserved_buffers(root), _dispatch(modules, checking):
        root(*args, **kwargs)
    return {paths[i]: (errors[i] if i in errors else "not called in the example forward")
            for i in paths if errors.get(i, "missing") != ""}


def decorated_dense(modules: Dict[str, torch.nn.Module]):
    """Context: inside it, each of `modules` computes `dense_decorated_experts` in place of its configured
    implementation."""
    return _dispatch(modules, lambda module, selected: dense_decorated_experts)
