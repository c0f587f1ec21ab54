"""Which module a test worker takes next when `make test` runs on parallel workers.

pytest-xdist's loadscope scheduling hands each idle worker the next module in the queue, even
one whose hold (tests/support/session.py) cannot be taken beside what the other workers run:
that worker then waits out the other's module, idle. This scheduler hands it the first queued
module that runs beside every module assigned to the other workers (a unit module, an
integration one beside a cluster-exclusive one), and the queue's head only when none does (a
worker must always be given more work, or the last test it holds never runs). The holds stay
the guarantee; this only keeps workers from queueing behind them.

The queue itself (tests/conftest.py) puts long modules first, by module_durations.json: each
module's seconds in full runs on two workers (its tests' setup, call and teardown from
`--junitxml`, summed; the least of three runs, to the nearest 5 s; modules under 10 s left
out), so that the session does not end with one worker on a long module while the other idles.
A module it does not name counts as short; a module that grows by minutes belongs in it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.session import Hold, read_module_holds, runs_beside

DURATIONS: Final = Path(__file__).with_name("module_durations.json")


def measured_seconds() -> dict[str, float]:
    """module_durations.json: seconds by module path (as in a node id)."""
    seconds: dict[str, float] = json.loads(DURATIONS.read_text())
    return seconds


def longest_first(modules: Sequence[str], seconds: Mapping[str, float]) -> list[str]:
    """`modules` by whole minutes measured, most first; a tie (a module not measured counts as
    none) keeps the order given, the shuffled one, so the modules of a minute still run in a
    different order each session."""
    return sorted(modules, key=lambda module: -(seconds.get(module, 0.0) // 60))


def first_beside(queued: Sequence[Hold | None], assigned_elsewhere: Sequence[Hold | None]) -> int:
    """The index of the first queued hold that runs beside all of `assigned_elsewhere`; 0 (the
    queue's head) if none does."""
    for index, hold in enumerate(queued):
        if all(runs_beside(hold, other) for other in assigned_elsewhere):
            return index
    return 0


class HoldAwareScheduling(LoadScopeScheduling):
    """LoadScopeScheduling (a module per work unit, the queue in collection order) that picks
    each worker's next module by the holds the workers collected."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self._holds: dict[str, Hold | None] | None = None

    def _hold(self, scope: str) -> Hold | None:
        if self._holds is None:  # read once, after every worker collected (schedule() runs then)
            self._holds = read_module_holds()
        # a module the workers did not report is assumed to run beside nothing
        return self._holds.get(scope.split("::", 1)[0], Hold.EXCLUSIVE)

    def _assign_work_unit(self, node: WorkerController) -> None:
        elsewhere = [
            self._hold(scope)
            for other, units in self.assigned_work.items()
            if other is not node
            for scope, unit in units.items()
            if not all(unit.values())
        ]
        scopes = list(self.workqueue)
        index = first_beside([self._hold(scope) for scope in scopes], elsewhere)
        self.workqueue.move_to_end(scopes[index], last=False)
        super()._assign_work_unit(node)
