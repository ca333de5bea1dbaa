"""Shared test set-up: tests import helpers from this folder, and context flags never leak."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# What the host_dispatch flag asks for in the CPU modes, here for the whole test process and the
# processes it starts (msrun workers, examples), before any MindSpore op: a 4-process msrun case
# takes 22 -> 12 s and 40 -> 22 CPU-seconds without MindSpore's spinning dispatch threads.
from mindspore_hyper.context import HOST_BLOCKING_ENV  # noqa: E402 (light: no MindSpore)

os.environ.setdefault(HOST_BLOCKING_ENV, "1")


def pytest_configure(config):
    """Synchronous MindSpore kernel launches for the whole test process, set before its first kernel:
    the simulation turns them on when it wraps a model (`sim_synchronize`), but once MindSpore's
    asynchronous launch pipeline has run a kernel (a single-device reference computed first) the
    switch comes too late and every later simulated test in that process runs its thousands of small
    kernels several times slower (a test file alone: 51 s instead of 13 s). Values are the same."""
    import mindspore as ms

    ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def clean_context():
    """Reset mindspore_hyper's context flags before and after every test (tests that set flags
    take this fixture to reach `mh`)."""
    import mindspore_hyper as mh

    mh.reset_context()
    yield mh
    mh.reset_context()


@pytest.fixture
def pynative(clean_context):
    """MindSpore in PYNATIVE_MODE for the test, and again after it (a test that switches to
    GRAPH_MODE does not leak it). Modules that need it: `pytestmark = pytest.mark.usefixtures("pynative")`."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield clean_context
    ms.set_context(mode=ms.PYNATIVE_MODE)


def pytest_itemcollected(item):
    """Under pytest-xdist (`make test` runs two workers), the msrun tests run one at a time on
    one worker: each already starts several processes, two at once would only slow both (marked
    as each is collected, before pytest-xdist reads the groups)."""
    if item.get_closest_marker("msrun") is not None:
        item.add_marker(pytest.mark.xdist_group("msrun"))
