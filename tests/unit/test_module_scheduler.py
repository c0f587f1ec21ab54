"""How the test session queues modules and which one a worker takes next
(tests/support/module_scheduler.py): pure choices over holds and measured durations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.module_scheduler import first_beside, longest_first, measured_seconds
from tests.support.session import Hold

pytestmark = pytest.mark.unit


def test_a_worker_is_given_the_first_module_that_runs_beside_the_others() -> None:
    queue = [Hold.CLUSTER_EXCLUSIVE, Hold.CLUSTER, Hold.PROCESSES, None]
    assert first_beside(queue, [Hold.CLUSTER_EXCLUSIVE]) == 2  # integration beside it, not e2e
    assert first_beside(queue, [Hold.EXCLUSIVE]) == 3  # only a unit module beside an exclusive one
    assert first_beside(queue, [Hold.CLUSTER, Hold.PROCESSES]) == 1  # all assigned elsewhere count
    assert first_beside(queue, []) == 0
    # nothing runs beside: the queue's head (a worker must always be given work)
    assert first_beside([Hold.EXCLUSIVE, Hold.CLUSTER], [Hold.EXCLUSIVE]) == 0


def test_modules_are_queued_by_whole_minutes_most_first_ties_in_the_given_order() -> None:
    seconds = {"a.py": 30.0, "b.py": 400.0, "c.py": 70.0, "d.py": 110.0}
    # c and d share their minute: the given order stands; e (not measured) counts as short
    assert longest_first(["a.py", "e.py", "d.py", "c.py", "b.py"], seconds) == [
        "b.py",
        "d.py",
        "c.py",
        "a.py",
        "e.py",
    ]
    assert longest_first(["c.py", "d.py"], seconds) == ["c.py", "d.py"]


def test_the_measured_durations_name_modules_that_exist() -> None:
    root = Path(__file__).resolve().parents[2]
    seconds = measured_seconds()
    assert seconds and all(s > 0 for s in seconds.values())
    missing = [module for module in seconds if not (root / module).is_file()]
    assert missing == [], f"module_durations.json names modules that are gone: {missing}"
