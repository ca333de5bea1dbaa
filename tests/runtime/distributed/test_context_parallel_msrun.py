"""Context parallelism under msrun: the example GPT (causal) on data 2 x cp 2 processes trains
like one device (5 momentum steps) with ring attention (K/V chunks around the cp ring over the
comm library's send/recv) and with Ulysses (AllToAll), the cp traffic reported forward and
backward."""
import json
import os

import numpy as np
import pytest

from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cp_worker.py")
KINDS = {"ring": "P2P", "ulysses": "AllToAll"}


@pytest.mark.msrun
def test_ring_and_ulysses_gpt_on_data2_x_cp2_processes(tmp_path):
    proc = run_msrun(WORKER, [tmp_path, 2, 2, *KINDS], 4, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 4)
    for method, kind in KINDS.items():
        for rank in range(4):
            result = json.loads((tmp_path / f"{method}-rank{rank}.json").read_text())
            assert result["rank"] == rank
            np.testing.assert_allclose(result["losses"], result["ref_losses"], rtol=1e-5, err_msg=method)
            assert result["param_error"] <= 1e-5, method
            assert result["comm"][kind]["cp"]["bytes"] > 0 and result["comm_backward"][kind]["cp"]["bytes"] > 0
