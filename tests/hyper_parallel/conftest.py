"""HyperParallel-API tests: each starts with no meshes, no API executions and PYNATIVE_MODE."""
import pytest


@pytest.fixture(autouse=True)
def fresh_session_for_each_test(fresh_session):
    """tests/conftest.py's `fresh_session`, for every test here."""
    yield fresh_session
