"""Shared test set-up: tests import helpers from this folder, and context flags never leak."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
