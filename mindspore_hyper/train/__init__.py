"""Training essentials around `train_step` (docs/training.md).

- `Telemetry`: once per step, loss, grad norm, tokens/s, MFU (FLOPs from the estimator, peak from
  a hardware preset or the calibrated CPU), per-device peak memory and communication; a progress
  bar; MindSpore SummaryRecord output.
- `StepRecord`: one step's figures; `model_flops_utilization`: the MFU formula; `ProgressBar`;
  `SummaryOutput`.

This room sits with the tools (it reads the estimator); the data loader is `mindspore_hyper.data`.
"""
from mindspore_hyper.train.mfu import flops_per_token_of, model_flops_utilization, peak_flops_of
from mindspore_hyper.train.progress import ProgressBar
from mindspore_hyper.train.step_record import StepRecord
from mindspore_hyper.train.summary import SummaryOutput
from mindspore_hyper.train.telemetry import Telemetry

__all__ = ["Telemetry", "StepRecord", "ProgressBar", "SummaryOutput", "model_flops_utilization", "flops_per_token_of",
           "peak_flops_of"]
