"""Pipeline execution: a model cut into stages runs a `mindspore_hyper.schedule` Schedule.

stages.py (cut a model into stage Cells), microbatch.py, computation.py (one stage's forward and
backward pieces), runner.py (a rank's action list), p2p.py (stage-boundary send/recv), model.py
(PipelineModel), build.py (`auto_parallelize` entry), report.py.
"""
from mindspore_hyper.pipeline.aux_loss import AuxLosses, add_aux_loss
from mindspore_hyper.pipeline.build import parallelize_pipeline
from mindspore_hyper.pipeline.pipeline_model import PipelineModel
from mindspore_hyper.pipeline.options import PipelineOptions
from mindspore_hyper.pipeline.stage_transport import P2PError, P2PTimeout

__all__ = ["PipelineModel", "PipelineOptions", "parallelize_pipeline", "P2PError", "P2PTimeout",
           "AuxLosses", "add_aux_loss"]
