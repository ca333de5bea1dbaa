"""One module per schedule family; each builder takes (num_stages, num_microbatches, num_chunks)."""
from mindspore_hyper.schedule.builders.gpipe import build_gpipe
from mindspore_hyper.schedule.builders.interleaved import build_interleaved_1f1b, interleaved_warmup
from mindspore_hyper.schedule.builders.one_f_one_b import build_1f1b, build_zb_h1
from mindspore_hyper.schedule.builders.v_shape import build_dualpipe_v, build_zb_v, v_stage_to_rank

__all__ = ["build_gpipe", "build_1f1b", "build_zb_h1", "build_interleaved_1f1b", "build_zb_v", "build_dualpipe_v",
           "interleaved_warmup", "v_stage_to_rank"]
