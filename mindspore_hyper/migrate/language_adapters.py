"""X-MOD's per-language adapters computed by masking instead of selecting rows, while exporting.

X-MOD's `XmodOutput.lang_adapter` selects the rows (sequences) of each language with a boolean mask,
`hidden[lang_ids == i]`, runs that language's adapter on them and writes them back,
`new[lang_ids == i] = adapter(...)`. How many rows a language has is a value of `lang_ids`, so the
selected tensor has a data-dependent size that torch.export can only keep as an unbacked symbol with
run-time assertions (`aten._assert_scalar`), which a Cell cannot express.

An adapter acts on each position alone (two Linear layers and an activation), so running it on every row
and keeping its result where the row has that language, `new = where(lang_ids == i, adapter(hidden), new)`,
gives the same values, and the same gradients (the rows not kept get a zero gradient through `where`, as the
rows not selected get none), at the cost of every adapter on every row (L times the adapter FLOPs for L
languages). That equality is checked, not assumed: before exporting, the masked form is compared with the
module's own `lang_adapter` on the hidden states it receives, with each row given another language (every
language present), and only modules where they agree (<= 1e-6 relative) are replaced.
"""
from __future__ import annotations

import contextlib
import types
from typing import Any, Dict, Iterator, List, Sequence, Tuple

import torch

from mindspore_hyper.migrate.lowering import preserved_buffers

__all__ = ["masked_language_adapters", "language_adapter_modules"]

TOLERANCE = 1e-6  # the two forms run the same ops on the same rows: equal up to the kernels' batch blocking


def _is_language_adapter(module: torch.nn.Module) -> bool:
    return type(module).__name__ == "XmodOutput" and isinstance(getattr(module, "adapter_modules", None),
                                                                torch.nn.ModuleDict) and hasattr(module, "lang_adapter")


def masked_lang_adapter(self, lang_ids: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    """`XmodOutput.lang_adapter` with each language's rows kept by `where` instead of selected (see the module
    docstring); the layer norms, residual and dropout as transformers writes them."""
    if not self.ln_before_adapter:
        residual = hidden_states
    if self.adapter_layer_norm is not None:
        hidden_states = self.adapter_layer_norm(hidden_states)
    elif self.adapter_reuse_layer_norm:
        hidden_states = self.LayerNorm(hidden_states)
    if self.ln_before_adapter:
        residual = hidden_states
    new_hidden_states = torch.zeros_like(hidden_states)
    trailing = (1,) * (hidden_states.dim() - lang_ids.dim())
    for adapter_idx, lang_key in enumerate(self.adapter_modules.keys()):
        keep = (lang_ids == adapter_idx).reshape(tuple(lang_ids.shape) + trailing)
        new_hidden_states = torch.where(keep, self.adapter_modules[lang_key](hidden_states), new_hidden_states)
    hidden_states = self.dropout(new_hidden_states)
    return hidden_states + residual


def language_adapter_modules(root: torch.nn.Module, args: Sequence[Any],
                             kwargs: Dict[str, Any]) -> Tuple[Dict[str, torch.nn.Module], List[str]]:
    """The X-MOD adapter modules of `root` whose masked form equals their own (checked on one run of `root`).

    Returns:
        (path -> module to replace, notes: one per module found, replaced or not and why).
    """
    found = {p: m for p, m in root.named_modules() if _is_language_adapter(m)}
    if not found:
        return {}, []
    seen: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
    for path, module in found.items():
        original = module.lang_adapter

        def record(lang_ids, hidden_states, path=path, original=original):
            seen.setdefault(path, (lang_ids, hidden_states))
            return original(lang_ids, hidden_states)
        module.lang_adapter = record
    try:
        with torch.no_grad(), preserved_buffers(root), torch.random.fork_rng(devices=[]):  # RNG state kept too
            root(*args, **kwargs)
    finally:
        for module in found.values():
            del module.lang_adapter
    chosen, notes = {}, []
    for path, module in found.items():
        if path not in seen:
            continue
        lang_ids, hidden = seen[path]
        languages = len(module.adapter_modules)
        rows = (torch.arange(lang_ids.shape[0]) % languages).to(lang_ids.dtype)  # every language present
        mixed = rows.reshape((-1,) + (1,) * (lang_ids.dim() - 1)).expand(lang_ids.shape).contiguous()
        training = module.training
        module.eval()  # dropout off for the comparison (it draws independently on the two calls)
        try:
            with torch.no_grad():
                want = module.lang_adapter(mixed, hidden)
                got = masked_lang_adapter(module, mixed, hidden)
            error = float((got - want).abs().max()) / (float(want.abs().max()) or 1.0)
        finally:
            module.train(training)
        if error <= TOLERANCE:
            chosen[path] = module
        else:
            notes.append(f"{path} ({type(module).__name__}): its language adapters left as written (the masked form "
                         f"differs by {error:.1e} relative)")
    if chosen:
        notes.append(f"{len(chosen)} X-MOD language-adapter module(s) ({next(iter(chosen))}, ...): each language's rows "
                     "kept by where() instead of selected by a boolean mask (exact: the adapters act per position; "
                     "checked on the example with every language present), every adapter runs on every row")
    return chosen, notes


@contextlib.contextmanager
def masked_language_adapters(modules: Dict[str, torch.nn.Module]) -> Iterator[None]:
    """Inside: each module's `lang_adapter` is `masked_lang_adapter`."""
    for module in modules.values():
        module.lang_adapter = types.MethodType(masked_lang_adapter, module)
    try:
        yield
    finally:
        for module in modules.values():
            del module.lang_adapter
