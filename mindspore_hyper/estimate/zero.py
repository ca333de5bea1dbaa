"""DeepSpeed's ZeRO-2/ZeRO-3 model-state memory estimators, same arguments, defaults and bytes.

The formulas are those of DeepSpeed's `estimate_zero3_model_states_mem_needs`
(deepspeed/runtime/zero/stage3.py) and `estimate_zero2_model_states_mem_needs`
(deepspeed/runtime/zero/stage_1_and_2.py), checked against deepspeedai/DeepSpeed at commit
edaa72212: mixed-precision Adam, 16-bit parameters and gradients plus 12 bytes of fp32 states
(master weights, momentum, variance) per parameter; `additional_buffer_factor` pads the CPU side.
The arithmetic is done in the same order so the truncated integers agree with DeepSpeed's.

The `*_all_cold` helpers print the table DeepSpeed prints for every offload option (and return
its rows); `*_all_live` derive the parameter counts from a MindSpore Cell as DeepSpeed does
from a torch module.
"""
from __future__ import annotations

import sys
from typing import List, Optional, TextIO, Tuple

__all__ = [
    "estimate_zero3_model_states_mem_needs", "estimate_zero2_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_cold", "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live", "estimate_zero2_model_states_mem_needs_all_live",
    "cell_param_counts",
]


def estimate_zero3_model_states_mem_needs(total_params: int, largest_layer_params: int, num_gpus_per_node: int = 1,
                                          num_nodes: int = 1, cpu_offload: bool = True,
                                          cpu_offload_params: bool = True, zero_init: bool = True,
                                          additional_buffer_factor: float = 1.5) -> Tuple[int, int, int]:
    """Model-state memory of ZeRO-3 per CPU (node) and per GPU (DeepSpeed's function of this name).

    Args:
        total_params: parameters of the model.
        largest_layer_params: parameters of its largest layer (module).
        num_gpus_per_node: GPUs per node.
        num_nodes: nodes.
        cpu_offload: optimizer states offloaded to the CPU.
        cpu_offload_params: parameters offloaded too (only with cpu_offload).
        zero_init: parameters created partitioned (`deepspeed.zero.Init`).
        additional_buffer_factor: padding factor on the CPU side.

    Returns:
        (cpu bytes per node, gpu bytes per GPU, largest layer bytes = 4 x largest_layer_params).
    """
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params  # its 16-bit parameters and gradients
    if cpu_offload and cpu_offload_params:
        gpu_mem = largest_layer_memory
        per_param = 18 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 18 * gpus_factor)
        cpu_mem = total_params * per_param * additional_buffer_factor
    elif cpu_offload:
        gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
        per_param = 16 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 16 * gpus_factor)
        cpu_mem = total_params * per_param * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        held = largest_layer_params if zero_init else total_params
        cpu_mem = held * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def estimate_zero2_model_states_mem_needs(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                          cpu_offload: bool = True,
                                          additional_buffer_factor: float = 1.5) -> Tuple[int, int]:
    """Model-state memory of ZeRO-2 per CPU (node) and per GPU (DeepSpeed's function of this name).

    Args:
        total_params: parameters of the model.
        num_gpus_per_node: GPUs per node.
        num_nodes: nodes.
        cpu_offload: optimizer states offloaded to the CPU (ZeRO-Offload).
        additional_buffer_factor: padding factor on the CPU side.

    Returns:
        (cpu bytes per node, gpu bytes per GPU).
    """
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        # 2 (16-bit parameters) + 18 / gpus: 16-bit and fp32 gradients, fp32 master, momentum, variance
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def _header(num_gpus_per_node: int, num_nodes: int, total_params: int,
            largest_layer_params: Optional[int]) -> List[str]:
    layer = f", largest layer {int(largest_layer_params / 1e6)}M" if largest_layer_params is not None else ""
    return [f"Model states memory (parameters, gradients, optimizer states) on {num_nodes} node(s) x "
            f"{num_gpus_per_node} GPU(s) per node",
            f"model: {int(total_params / 1e6)}M parameters{layer}",
            "  per CPU  |  per GPU |   options"]


def _row_text(row: dict) -> str:
    return f" {row['cpu_bytes'] / 2**30:7.2f}GB | {row['gpu_bytes'] / 2**30:6.2f}GB | {row['options']}"


def estimate_zero3_model_states_mem_needs_all_cold(total_params: int, largest_layer_params: int,
                                                   num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5,
                                                   stream: Optional[TextIO] = None) -> List[dict]:
    """Print ZeRO-3's estimate for every offload option, as DeepSpeed's function of this name does.

    Args:
        total_params, largest_layer_params, num_gpus_per_node, num_nodes, additional_buffer_factor:
            as in `estimate_zero3_model_states_mem_needs`.
        stream: where to print (default stdout).

    Returns:
        The rows printed: dicts with cpu_offload, cpu_offload_params, zero_init, cpu_bytes,
        gpu_bytes and the options text, in DeepSpeed's order.
    """
    rows = []
    for cpu_offload, offload_params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                total_params, largest_layer_params, num_gpus_per_node, num_nodes, cpu_offload, offload_params,
                zero_init, additional_buffer_factor)
            options = (f"offload_param={'cpu ' if offload_params else 'none'}, "
                       f"offload_optimizer={'cpu ' if cpu_offload else 'none'}, zero_init={int(zero_init)}")
            rows.append({"cpu_offload": cpu_offload, "cpu_offload_params": offload_params, "zero_init": zero_init,
                         "cpu_bytes": cpu, "gpu_bytes": gpu, "options": options})
    lines = _header(num_gpus_per_node, num_nodes, total_params, largest_layer_params) + [_row_text(r) for r in rows]
    print("\n".join(lines), file=stream or sys.stdout)
    return rows


def estimate_zero2_model_states_mem_needs_all_cold(total_params: int, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5,
                                                   stream: Optional[TextIO] = None) -> List[dict]:
    """Print ZeRO-2's estimate with and without optimizer offload, as DeepSpeed's function does.

    Args:
        total_params, num_gpus_per_node, num_nodes, additional_buffer_factor: as in
            `estimate_zero2_model_states_mem_needs`.
        stream: where to print (default stdout).

    Returns:
        The rows printed: dicts with cpu_offload, cpu_bytes, gpu_bytes and the options text.
    """
    rows = []
    for cpu_offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node, num_nodes, cpu_offload,
                                                         additional_buffer_factor)
        rows.append({"cpu_offload": cpu_offload, "cpu_bytes": cpu, "gpu_bytes": gpu,
                     "options": f"offload_optimizer={'cpu ' if cpu_offload else 'none'}"})
    lines = _header(num_gpus_per_node, num_nodes, total_params, None) + [_row_text(r) for r in rows]
    print("\n".join(lines), file=stream or sys.stdout)
    return rows


def cell_param_counts(cell) -> Tuple[int, int]:
    """(total parameters, largest parameters owned directly by one sub-Cell) of a MindSpore Cell.

    A Parameter shared by several Cells is counted once in the total (as DeepSpeed counts a
    torch module's shared parameters once)."""
    total = sum({id(p): p.size for p in cell.get_parameters()}.values())
    largest = max((sum(p.size for p in sub.get_parameters(expand=False)) for _, sub in cell.cells_and_names()),
                  default=0)
    return total, largest


def estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5,
                                                   stream: Optional[TextIO] = None) -> List[dict]:
    """`estimate_zero3_model_states_mem_needs_all_cold` with the counts of a MindSpore Cell."""
    total, largest = cell_param_counts(model)
    return estimate_zero3_model_states_mem_needs_all_cold(total, largest, num_gpus_per_node, num_nodes,
                                                          additional_buffer_factor, stream)


def estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node: int = 1, num_nodes: int = 1,
                                                   additional_buffer_factor: float = 1.5,
                                                   stream: Optional[TextIO] = None) -> List[dict]:
    """`estimate_zero2_model_states_mem_needs_all_cold` with the parameter count of a MindSpore Cell."""
    total, _ = cell_param_counts(model)
    return estimate_zero2_model_states_mem_needs_all_cold(total, num_gpus_per_node, num_nodes,
                                                          additional_buffer_factor, stream)
