"""Fixtures of the comm tests (helpers in comm_helpers.py)."""
import pytest
from comm_helpers import shm_group_pair


@pytest.fixture
def shm_pair():
    groups = shm_group_pair()
    yield groups
    for g in groups:
        g.close()
