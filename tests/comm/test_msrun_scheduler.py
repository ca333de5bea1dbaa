"""exit_if_msrun_scheduler: msrun's scheduler exits before MindSpore's import with the shared-memory
transport, and only then; a worker that let it go and later asks for a transport that needs it
is refused by name (the msrun tests' workers run the real launch)."""
import pytest

from mindspore_hyper import reset_context, set_context
from mindspore_hyper.comm.msrun_scheduler import scheduler_left
from mindspore_hyper.launch import exit_if_msrun_scheduler


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv("MSHYPER_MSRUN_SCHEDULER_LEFT", raising=False)
    monkeypatch.delenv("MS_HYPER_DIST_TRANSPORT", raising=False)
    reset_context()
    yield
    reset_context()


def test_the_scheduler_exits_with_shm(monkeypatch):
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    with pytest.raises(SystemExit) as exited:
        exit_if_msrun_scheduler()
    assert exited.value.code == 0


@pytest.mark.parametrize("transport", ["mindspore", "hybrid"])
def test_the_scheduler_stays_when_the_transport_needs_it(monkeypatch, transport):
    monkeypatch.setenv("MS_ROLE", "MS_SCHED")
    monkeypatch.setenv("MS_HYPER_DIST_TRANSPORT", transport)
    exit_if_msrun_scheduler()  # returns: this scheduler serves the job
    assert not scheduler_left()
    set_context(dist_transport="shm")
    monkeypatch.delenv("MS_HYPER_DIST_TRANSPORT")
    set_context(dist_transport=transport)  # the flag from set_context counts as well
    exit_if_msrun_scheduler()
    assert not scheduler_left()


def test_outside_msrun_nothing_happens(monkeypatch):
    monkeypatch.delenv("MS_ROLE", raising=False)
    exit_if_msrun_scheduler()
    assert not scheduler_left()


def test_a_worker_that_let_the_scheduler_go_cannot_switch_to_mindspore(monkeypatch):
    from mindspore_hyper.runtime.distributed.world import World

    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    exit_if_msrun_scheduler()
    assert scheduler_left()
    set_context(dist_transport="mindspore")
    with pytest.raises(ValueError, match=r"dist_transport='mindspore' needs msrun's scheduler.*exit_if_msrun_scheduler"):
        World.from_env()
