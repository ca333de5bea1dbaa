"""HyperMPMD runtime: submodules on their own device groups, per-group timelines, dynamic
rebalancing of devices between groups (simulation), groups on real processes under msrun."""
from mindspore_hyper.mpmd.mpmd_model import MPMDModel
from mindspore_hyper.mpmd.mpmd_report import MPMDSection
from mindspore_hyper.mpmd.rebalancing import DeviceRebalancing, RebalanceRecord, apply_device_plan
from mindspore_hyper.mpmd.group_placement import GroupPlacement, data_parallel_strategy, place_groups
from mindspore_hyper.mpmd.scaling import for_processes, scale_groups
from mindspore_hyper.mpmd.group_timeline import GroupTimeline

__all__ = ["MPMDModel", "MPMDSection", "RebalanceRecord", "DeviceRebalancing", "apply_device_plan", "GroupPlacement",
           "data_parallel_strategy", "place_groups",
           "scale_groups", "for_processes", "GroupTimeline", "check_mpmd_enabled"]


def check_mpmd_enabled(groups) -> None:
    """Raise when a strategy declares device groups (a sequence of DeviceGroup) but the
    `hyper_mpmd` flag is off (never run the groups silently as one SPMD program)."""
    from mindspore_hyper.context import get_context

    if groups and not get_context("hyper_mpmd"):
        names = ", ".join(f"{g.name} ({g.path})" for g in groups)
        raise ValueError(f"the config declares device groups ({names}), which run as separate programs "
                         "(HyperMPMD): call mindspore_hyper.set_context(hyper_mpmd=True) to enable it")
