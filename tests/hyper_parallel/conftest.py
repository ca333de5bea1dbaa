"""HyperParallel-API tests: each starts with no meshes, no API executions and PYNATIVE_MODE."""
import pytest


@pytest.fixture(autouse=True)
def fresh_session(pynative):
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    yield pynative
    reset_session()
