"""Memory estimator: will a job fit, per device, before renting the cluster (docs/estimate.md).

- `activation_bytes_per_layer`: Korthikanti et al. 2022, Table 2.
- `estimate_zero3_model_states_mem_needs` / `estimate_zero2_model_states_mem_needs` (and their
  `_all_cold` / `_all_live` tables): DeepSpeed's estimators, same arguments and bytes.
- `estimate_job(TransformerConfig, JobStrategy)`: parameters, gradients, optimizer states,
  activations and KV cache per device and pipeline stage; `largest_fitting`; `sequence_sweep`
  and `plot_sweep`.
- `estimate_step_time(TransformerConfig, JobStrategy, hardware)`: seconds, MFU, tokens/s and the
  breakdown of one training step on a hardware preset (`load_hardware`, configs/hardware/*.yaml).
- `crosscheck_gpt` / `simulate_step` / `compare`: the estimate against the simulation's measured
  accounting for examples/models.py's GPT (laid out by `gpt_parallel_config`).
"""
from mindspore_hyper.estimate.activations import RECOMPUTE_MODES, TABLE2_ROWS, activation_bytes_per_layer, table2_row
from mindspore_hyper.estimate.crosscheck import Comparison, compare, crosscheck_gpt, simulate_step
from mindspore_hyper.estimate.gpt_layout import gpt_parallel_config
from mindspore_hyper.estimate.hardware import Efficiency, Hardware, Level, hardware_presets, load_hardware
from mindspore_hyper.estimate.job import (JobEstimate, StageEstimate, estimate_job, estimate_stage, format_bytes,
                                          in_flight_microbatches, stage_layers)
from mindspore_hyper.estimate.job_file import build_config, build_job, build_strategy, read_job_file
from mindspore_hyper.estimate.limits import FIT_FIELDS, largest_fitting
from mindspore_hyper.estimate.transformer_config import PRESETS, ParamCounts, TransformerConfig, preset
from mindspore_hyper.estimate.simulation_activations import simulation_activation_bytes
from mindspore_hyper.estimate.step_time import CommTerm, LayerTime, StepTimeEstimate, estimate_step_time, global_batch
from mindspore_hyper.estimate.strategy import ACTIVATION_MODELS, CONTEXT_METHODS, SCHEDULES, TIERS, JobStrategy
from mindspore_hyper.estimate.sweep import DEFAULT_SEQ_LENS, plot_sweep, sequence_sweep
from mindspore_hyper.estimate.zero import (cell_param_counts, estimate_zero2_model_states_mem_needs,
                                           estimate_zero2_model_states_mem_needs_all_cold,
                                           estimate_zero2_model_states_mem_needs_all_live,
                                           estimate_zero3_model_states_mem_needs,
                                           estimate_zero3_model_states_mem_needs_all_cold,
                                           estimate_zero3_model_states_mem_needs_all_live)

__all__ = [
    "activation_bytes_per_layer", "table2_row", "TABLE2_ROWS", "RECOMPUTE_MODES",
    "estimate_zero3_model_states_mem_needs", "estimate_zero2_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_cold", "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live", "estimate_zero2_model_states_mem_needs_all_live",
    "cell_param_counts",
    "TransformerConfig", "ParamCounts", "PRESETS", "preset", "JobStrategy", "TIERS", "ACTIVATION_MODELS",
    "estimate_job", "estimate_stage", "JobEstimate", "StageEstimate", "stage_layers", "in_flight_microbatches",
    "format_bytes", "simulation_activation_bytes", "largest_fitting", "FIT_FIELDS",
    "sequence_sweep", "plot_sweep", "DEFAULT_SEQ_LENS",
    "read_job_file", "build_config", "build_strategy", "build_job",
    "gpt_parallel_config", "crosscheck_gpt", "simulate_step", "compare", "Comparison",
    "CONTEXT_METHODS", "SCHEDULES", "Hardware", "Level", "Efficiency", "load_hardware", "hardware_presets",
    "estimate_step_time", "StepTimeEstimate", "LayerTime", "CommTerm", "global_batch",
]
