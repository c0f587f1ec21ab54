"""The holds that keep test modules apart (tests/support/session.py): which two may run side by
side. Threads stand for the workers: each hold opens its own lock files, and flock locks of two
open files exclude each other within one process as across processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.support.session import (
    ENV_SESSION_DIR,
    Hold,
    cluster_hold,
    read_module_holds,
    runs_beside,
    write_module_holds,
)

pytestmark = pytest.mark.unit

# Long enough for a thread to take a free hold; a hold that must wait never gets it meanwhile.
SETTLE_S = 0.3


@pytest.fixture(autouse=True)
def _session_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(ENV_SESSION_DIR, str(tmp_path))
    yield


class Holder:
    """A hold taken on a thread of its own, kept until `release`."""

    def __init__(self, hold: Hold) -> None:
        self.taken = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster_hold(hold),), daemon=True)
        self._thread.start()

    def _run(self, hold: AbstractContextManager[None]) -> None:
        with hold:
            self.taken.set()
            self._release.wait(30)

    def release(self) -> None:
        self._release.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.mark.parametrize(
    ("first", "second", "beside"),
    [
        (Hold.CLUSTER_EXCLUSIVE, Hold.PROCESSES, True),  # integration beside a cluster-changing e2e
        (Hold.CLUSTER, Hold.CLUSTER, True),
        (Hold.CLUSTER, Hold.PROCESSES, True),
        (Hold.CLUSTER_EXCLUSIVE, Hold.CLUSTER, False),
        (Hold.CLUSTER, Hold.CLUSTER_EXCLUSIVE, False),
        (Hold.CLUSTER_EXCLUSIVE, Hold.CLUSTER_EXCLUSIVE, False),
        (Hold.EXCLUSIVE, Hold.PROCESSES, False),
        (Hold.PROCESSES, Hold.EXCLUSIVE, False),
        (Hold.EXCLUSIVE, Hold.CLUSTER, False),
    ],
)
def test_which_holds_run_side_by_side(first: Hold, second: Hold, beside: bool) -> None:
    # the scheduler's rule says what the locks do
    assert runs_beside(first, second) is beside and runs_beside(second, first) is beside
    a = Holder(first)
    assert a.taken.wait(10)
    b = Holder(second)
    try:
        if beside:
            assert b.taken.wait(10), f"{second.name} waited for {first.name}"
        else:
            assert not b.taken.wait(SETTLE_S), f"{second.name} ran beside {first.name}"
        a.release()
        assert b.taken.wait(10), f"{second.name} never ran after {first.name}"
    finally:
        a.release()
        b.release()


def test_a_waiting_exclusive_hold_lets_no_new_shared_one_pass() -> None:
    """Fairness: once an exclusive hold waits, a later shared one waits behind it."""
    running = Holder(Hold.CLUSTER)
    assert running.taken.wait(10)
    waiting = Holder(Hold.CLUSTER_EXCLUSIVE)
    assert not waiting.taken.wait(SETTLE_S)
    later = Holder(Hold.CLUSTER)
    try:
        assert not later.taken.wait(SETTLE_S), "a shared hold passed a waiting exclusive one"
        running.release()
        assert waiting.taken.wait(10)
        assert not later.taken.wait(SETTLE_S)
        waiting.release()
        assert later.taken.wait(10)
    finally:
        for h in (running, waiting, later):
            h.release()


@pytest.mark.parametrize("hold", list(Hold))
def test_a_unit_module_runs_beside_every_hold(hold: Hold) -> None:
    assert runs_beside(None, hold) and runs_beside(hold, None) and runs_beside(None, None)


def test_module_holds_written_by_a_worker_are_read_back() -> None:
    assert read_module_holds() == {}  # before any worker collected
    holds = {"tests/e2e/test_a.py": Hold.CLUSTER_EXCLUSIVE, "tests/unit/test_b.py": None}
    write_module_holds(holds)
    assert read_module_holds() == holds
