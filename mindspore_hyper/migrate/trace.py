"""Trace a torch module: torch.fx first (shape-generic code), torch.export when fx cannot trace it."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import torch

from mindspore_hyper.migrate.errors import TraceFailedError, UnsupportedOpError
from mindspore_hyper.migrate.graph import Graph
from mindspore_hyper.migrate.trace_export import trace_export
from mindspore_hyper.migrate.trace_fx import bind_inputs, trace_fx

__all__ = ["trace", "TRACERS"]

TRACERS = ("auto", "fx", "export")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def trace(module: torch.nn.Module, args: Sequence[Any], kwargs: Optional[Dict[str, Any]] = None,
          tracer: str = "auto") -> Graph:
    """Trace `module` on example inputs.

    Args:
        module: the torch model.
        args, kwargs: example inputs of its forward.
        tracer: "auto" (torch.fx, then torch.export if fx fails), "fx" or "export".

    Returns:
        The lowered Graph; `graph.notes` says why fx was not used when export was.

    Raises:
        ValueError: unknown `tracer`.
        TypeError: the example inputs do not fit the forward signature.
        TraceFailedError: no tracer could trace the model (each one's reason is in the message).
    """
    if tracer not in TRACERS:
        raise ValueError(f"tracer={tracer!r}; expected one of {TRACERS}")
    kwargs = dict(kwargs or {})
    bind_inputs(module, args, kwargs)
    fx_error = None
    if tracer in ("auto", "fx"):
        try:
            return trace_fx(module, args, kwargs)
        except UnsupportedOpError:
            raise
        except Exception as exc:  # torch.fx raises many kinds (TraceError, proxy misuse, ...)
            if tracer == "fx":
                raise TraceFailedError(f"torch.fx cannot trace {type(module).__name__}: {_first_line(exc)}") from exc
            fx_error = exc
    try:
        graph = trace_export(module, args, kwargs)
    except UnsupportedOpError:
        raise
    except Exception as exc:
        reasons = [f"torch.export: {_first_line(exc)}"]
        if fx_error is not None:
            reasons.insert(0, f"torch.fx: {_first_line(fx_error)}")
        raise TraceFailedError(f"cannot trace {type(module).__name__}:\n  " + "\n  ".join(reasons)) from exc
    if fx_error is not None:
        graph.notes.append(f"torch.fx could not trace the model ({_first_line(fx_error)}); traced with "
                           "torch.export instead, so the Cell is specialised to the example input shapes")
    else:
        graph.notes.append("traced with torch.export: the Cell is specialised to the example input shapes")
    return graph
