"""A converted (structure="modules") Llama trains under msrun on 2 processes with tensor parallelism
from YAML module_level patterns on the torch names, as on one device (losses and every rank's
parameter shards after 3 Adam steps)."""
import json
import os

import numpy as np
import pytest

from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrate_msrun_worker.py")


@pytest.mark.msrun
def test_converted_llama_tensor_parallel_on_2_processes(tmp_path):
    proc = run_msrun(WORKER, [tmp_path], 2, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 2)
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["rank"] == rank
        np.testing.assert_allclose(result["losses"], result["ref_losses"], rtol=1e-5)
        assert "model.layers.0.self_attn.q_proj.weight" in {n.split("lm.", 1)[-1] for n in result["sharded"]}
        worst = max(result["param_error"].items(), key=lambda item: item[1])
        assert worst[1] <= 1e-4, worst
