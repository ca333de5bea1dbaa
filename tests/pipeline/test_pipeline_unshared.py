"""check_unshared: a Parameter used by stages on two ranks is refused under msrun (tied weights)."""
from types import SimpleNamespace

import pytest

from mindspore_hyper.pipeline.stages import check_unshared


def test_a_parameter_on_two_ranks_is_refused_and_on_one_rank_passes():
    layers = SimpleNamespace(parameters=[("embed",), ("w1",), ("w2",), ("embed",)])  # names per layer
    two_ranks = SimpleNamespace(stage_to_rank=(0, 1))
    with pytest.raises(ValueError, match=r"parameter 'embed' is used by stages on ranks 0 and 1 \(tied weights\)"):
        check_unshared(layers, two_ranks, (2, 2))
    check_unshared(layers, SimpleNamespace(stage_to_rank=(0, 1, 0)), (1, 2, 1))  # both uses on rank 0
