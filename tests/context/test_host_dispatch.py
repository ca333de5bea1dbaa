"""The host_dispatch flag: in the CPU modes MindSpore runs ops on the calling thread (no spinning
dispatch threads), set before its first op; async, native mode and the user's own setting of
MindSpore's variable keep MindSpore's threads. Each case runs in a fresh interpreter, whose
environment is the test's (the suite's conftest sets the variable for itself)."""
import os
import subprocess
import sys

import pytest

from mindspore_hyper.context import HOST_BLOCKING_ENV
from paths import REPO_ROOT

PROGRAM = """
import os, sys
{before}
import numpy as np
import mindspore as ms
from mindspore import Tensor
ms.set_context(mode=ms.PYNATIVE_MODE)
print("sum", float((Tensor(np.ones((4, 4), np.float32)) * 2 + 1).sum().asnumpy()))
threads = {{open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task")}}
print("env", os.environ.get("MS_DEV_HOST_BLOCKING_RUN"))
print("dispatch threads", sorted(threads & {{"frontend_queue", "backend_queue"}}))
"""


def run(before: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MS_HYPER_") and k != HOST_BLOCKING_ENV}
    full.update(env, PYTHONPATH=str(REPO_ROOT))
    result = subprocess.run([sys.executable, "-c", PROGRAM.format(before=before)], capture_output=True, text=True,
                            env=full, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sum 48.0" in result.stdout, result.stdout
    return result.stdout


INLINE = "env 1\ndispatch threads []"
ASYNC = "dispatch threads ['backend_queue', 'frontend_queue']"


@pytest.mark.parametrize("before,env,expected", [
    ("import mindspore_hyper", {"MS_HYPER_MODE": "distributed"}, INLINE),
    ("import mindspore_hyper as mh; mh.set_context(mode='simulation')", {}, INLINE),
    ("import mindspore_hyper as mh; mh.get_context('mode')", {}, INLINE),  # the CPU default: simulation
    ("import mindspore_hyper", {"MS_HYPER_MODE": "distributed", "MS_HYPER_HOST_DISPATCH": "async"}, ASYNC),
    ("import mindspore_hyper as mh; mh.set_context(mode='simulation', host_dispatch='async')", {}, ASYNC),
    ("import mindspore_hyper as mh; mh.set_context(mode='native')", {}, ASYNC),
    ("import mindspore_hyper", {}, ASYNC),  # no mode known before the first op: nothing changes
    ("import mindspore_hyper as mh; mh.set_context(mode='simulation')", {HOST_BLOCKING_ENV: "0"}, ASYNC),
])
def test_inline_dispatch_in_the_cpu_modes_only(before, env, expected):
    assert expected in run(before, **env)


def test_a_bad_value_is_named_when_the_mode_is_read():
    import mindspore_hyper as mh

    with pytest.raises(ValueError, match="host_dispatch='spin'"):
        mh.set_context(host_dispatch="spin")
    os.environ["MS_HYPER_HOST_DISPATCH"] = "spin"
    try:
        with pytest.raises(ValueError, match="MS_HYPER_HOST_DISPATCH"):
            mh.get_context("mode")
    finally:
        del os.environ["MS_HYPER_HOST_DISPATCH"]
