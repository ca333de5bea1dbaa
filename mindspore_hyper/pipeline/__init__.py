"""Pipeline execution: a model cut into stages runs a `mindspore_hyper.schedule` Schedule.

stages.py (cut a model into stage Cells), microbatch.py, computation.py (one stage's forward and
backward pieces), runner.py (a rank's action list), stage_transport.py (stage-boundary send/recv),
pipeline_model.py (PipelineModel, ParallelModel's protocol) with pipeline_step.py (one train_step:
clipping, loss scaling), global_grad_norm.py, stage_mesh.py, distributed_forward.py,
step_timelines.py and stage_rebalancing.py, build.py (`auto_parallelize` entry), report.py (the
StepReport and its PipelineSection).
"""
from mindspore_hyper.pipeline.aux_loss import AuxLosses, add_aux_loss
from mindspore_hyper.pipeline.build import parallelize_pipeline
from mindspore_hyper.pipeline.pipeline_model import PipelineModel
from mindspore_hyper.pipeline.options import PipelineOptions
from mindspore_hyper.pipeline.stage_transport import P2PError, P2PTimeout

__all__ = ["PipelineModel", "PipelineOptions", "parallelize_pipeline", "P2PError", "P2PTimeout",
           "AuxLosses", "add_aux_loss"]
