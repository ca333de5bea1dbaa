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
