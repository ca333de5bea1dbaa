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
# msrun jobs on MindSpore's transport (dist_transport "mindspore" / "hybrid"): a worker that starts
# before msrun's scheduler listens retries its registration after MS_RETRY_INTERVAL_LOWER to
# _UPPER seconds (MindSpore's defaults 3 and 5), and under load the 4 registrations trickled in
# over 42 s; with 1 s they take about one second (the dist test's 4-process job: 85 -> 41 s wall
# at load 10-13, the same CPU seconds). Only the waiting between retries changes.
os.environ.setdefault("MS_RETRY_INTERVAL_LOWER", "1")
os.environ.setdefault("MS_RETRY_INTERVAL_UPPER", "1")


def pytest_configure(config):
    """Synchronous MindSpore kernel launches for the whole test process, set before its first kernel:
    the simulation turns them on when it wraps a model (`sim_synchronize`), but once MindSpore's
    asynchronous launch pipeline has run a kernel (a single-device reference computed first) the
    switch comes too late and every later simulated test in that process runs its thousands of small
    kernels several times slower (a test file alone: 51 s instead of 13 s). Values are the same.
    The pytest-xdist controller (`make test`'s `-n 2`) runs no test, only its workers do (each
    configures itself): it skips MindSpore's import (several seconds before the workers start)."""
    if _is_xdist_controller(config):
        config.option.loadscopereorder = False  # the workers' order (pytest_collection_modifyitems)
        return
    import mindspore as ms

    ms.runtime.launch_blocking()


def _is_xdist_controller(config) -> bool:
    """Whether this process is pytest-xdist's controller, which distributes tests and runs none."""
    return getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput")


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


@pytest.fixture
def fresh_session(pynative):
    """No HyperParallel-API meshes or executions before and after the test, in PYNATIVE_MODE
    (tests/hyper_parallel/ uses it for every test)."""
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    yield pynative
    reset_session()


def pytest_itemcollected(item):
    """Under pytest-xdist (`make test` runs two workers), the msrun tests run one at a time on
    one worker: each already starts several processes, two at once would only slow both (marked
    as each is collected, before pytest-xdist reads the groups)."""
    if item.get_closest_marker("msrun") is not None:
        item.add_marker(pytest.mark.xdist_group("msrun"))


# The pytest-xdist groups, longest first (quiet 2-core runs: the msrun launches several minutes
# together, the layer zoo's sweep about a minute, the docs blocks and the op sweep about 20 s each).
GROUPS_LONGEST_FIRST = ("msrun", "layer_zoo", "docs_snippets", "op_sweep")


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the groups first, longest first, then every other test in collection
    order; the controller keeps this order (`--dist loadgroup` would sort the groups by their
    number of tests, which put the msrun group, the longest, after the op sweep and the docs
    blocks). A worker that finishes its group takes single tests, so the long group starts at once
    and the short tests fill both workers to the end. Without pytest-xdist the order is unchanged."""
    if not hasattr(config, "workerinput"):
        return
    rank = {group: i for i, group in enumerate(GROUPS_LONGEST_FIRST)}

    def place(item):
        marker = item.get_closest_marker("xdist_group")
        group = (marker.args[0] if marker.args else marker.kwargs.get("name")) if marker is not None else None
        return rank.get(group, len(rank))

    items.sort(key=place)  # stable: the collection order within each place
