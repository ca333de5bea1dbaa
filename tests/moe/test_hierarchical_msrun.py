"""The hierarchical (two-level) expert dispatch under msrun: 4 processes, expert 4 in 2 groups
of 2; both hops are uneven AllToAlls of the shared-memory transport. 3 Adam steps equal one
device; the bytes per link level are measured from the exchanges (the combine's inter-group rows
de-duplicated like the dispatch's). The msrun job is shared with the expert-parallel test
(conftest.py's `moe_msrun_results`)."""
import numpy as np
import pytest

from moe_msrun_cases import HIERARCHICAL_CASES


@pytest.mark.msrun
def test_hierarchical_dispatch_on_4_processes_equals_single_device(moe_msrun_results):
    """Also with batches of 4 tokens (one per process), where some exchanges carry no rows to a
    process: its backward AllToAlls still run in the same order as the others' (flat and
    hierarchical)."""
    inter = back = 0
    for rank, res in enumerate(moe_msrun_results):
        for case in HIERARCHICAL_CASES:
            out = res[case]
            assert out["rank"] == rank
            np.testing.assert_allclose(out["losses"], out["ref_losses"], rtol=1e-5)
            for what in ("grad_error", "param_error"):
                assert max(out[what].values()) < 1e-4, (case, what, out[what])
            assert out["held_expert_shape"][0] == 2  # 8 experts over expert=4
            levels = out["stats"]["dispatch_link_bytes"]
            assert set(levels) == {"local", "intra_group", "inter_group"}
            if case == "1x4x1+hier":
                inter += levels["inter_group"]
                back += out["stats"]["combine_link_bytes"]["inter_group"]
                assert out["stats"]["metadata"] > 0  # counts of both hops and the first hop's 1-bit masks
    assert inter > 0
    # combine: one row per (token, group) back, as many as the dispatch's rows (which also carry
    # the token's gates for the group's 4 experts: 16 + 4 columns)
    assert back * (16 + 4) == inter * 16
