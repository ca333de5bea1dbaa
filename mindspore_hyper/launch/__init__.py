"""Launching jobs that survive: `run_elastic` restarts an msrun job when a worker dies, on the
processes that remain; `elastic_strategy` (worker side) re-derives a strategy for the job's world
size by resizing its data axis. See docs/checkpoint.md ("Elastic restart").
`exit_if_msrun_scheduler` lets msrun's scheduler process go before it imports MindSpore."""
from mindspore_hyper.comm.msrun_scheduler import exit_if_msrun_scheduler
from mindspore_hyper.launch.elastic import Attempt, ElasticError, ElasticResult, WorkerFailure, next_world_size, run_elastic
from mindspore_hyper.launch.resize import CannotResize, EXIT_CANNOT_RESIZE, elastic_strategy, resize_data_axis

__all__ = ["run_elastic", "next_world_size", "Attempt", "ElasticResult", "ElasticError", "WorkerFailure",
           "resize_data_axis", "elastic_strategy", "CannotResize", "EXIT_CANNOT_RESIZE", "exit_if_msrun_scheduler"]
