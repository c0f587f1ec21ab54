"""Which module a test worker takes next when `make test` runs on parallel workers.

pytest-xdist's loadscope scheduling hands each idle worker the next module in the queue, even
one whose hold (tests/support/session.py) cannot be taken beside what the other workers run:
that worker then waits out the other's module, idle, and if the other worker takes the
contested hold first (a long e2e module beside a cluster-exclusive one, say) it waits out all
of it. This scheduler hands a worker the first queued module that runs beside every module
assigned to the other workers (a unit module, an integration one beside a cluster-exclusive
one). When none does, the worker is given nothing yet and asked again as the other workers'
tests end; the queue's head only when waiting could stall the session (`may_wait`). The holds
stay the guarantee; this only keeps workers from queueing behind them.

The queue itself (tests/conftest.py) puts long modules first, by their measured seconds in
whole runs (module_durations.json, written by tests/support/module_durations.py from runs'
`--junitxml`), so that the session does not end with one worker on a long module while the
other idles. A module it does not name counts as short; a module that grows by minutes belongs
in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadScopeScheduling
from xdist.workermanage import WorkerController

from tests.support.session import Hold, module_path, read_module_holds, runs_beside


def longest_first(modules: Sequence[str], seconds: Mapping[str, float]) -> list[str]:
    """`modules` by whole minutes measured, most first; a tie (a module not measured counts as
    none) keeps the order given, the shuffled one, so the modules of a minute still run in a
    different order each session."""
    return sorted(modules, key=lambda module: -(seconds.get(module, 0.0) // 60))


def first_beside(queued: Sequence[Hold | None], assigned_elsewhere: Sequence[Hold | None]) -> int | None:
    """The index of the first queued hold that runs beside all of `assigned_elsewhere`; None if
    none does."""
    for index, hold in enumerate(queued):
        if all(runs_beside(hold, other) for other in assigned_elsewhere):
            return index
    return None


@dataclass(frozen=True)
class OtherWorker:
    """Another worker as a waiting one sees it: the holds of the modules it has not finished,
    whether it was left waiting too, and whether it has tests left (whose ends ask the waiting
    worker again)."""

    holds: tuple[Hold | None, ...]
    waiting: bool
    has_tests: bool


def may_wait(own: Sequence[Hold | None], others: Sequence[OtherWorker]) -> bool:
    """Whether a worker with no module to take beside the others may be given nothing yet.

    A worker keeps the hold of its last module until it is given more (xdist runs a test only
    once it knows the next one, and the hold ends with the module's last teardown), so it may
    wait only while every module the others were given runs beside what it holds, and while
    another worker that is not waiting has tests left: their ends are what ask it again."""
    if not any(other.has_tests and not other.waiting for other in others):
        return False
    return all(runs_beside(mine, theirs) for other in others for theirs in other.holds for mine in own)


class HoldAwareScheduling(LoadScopeScheduling):
    """LoadScopeScheduling (a module per work unit, the queue in collection order) that picks
    each worker's next module by the holds the workers collected, and leaves a worker waiting
    rather than hand it a module that would only wait for another worker's."""

    def __init__(
        self,
        config: pytest.Config,
        log: Producer | None = None,
        holds: Mapping[str, Hold | None] | None = None,
    ) -> None:
        super().__init__(config, log)
        # each module's hold by its path; None: as the workers collected them (read_module_holds)
        self._holds = dict(holds) if holds is not None else None
        self._waiting: list[WorkerController] = []  # in the order they were left waiting

    def _hold(self, scope: str) -> Hold | None:
        if self._holds is None:  # read once, after every worker collected (schedule() runs then)
            self._holds = read_module_holds()
        # a module the workers did not report is assumed to run beside nothing
        return self._holds.get(module_path(scope), Hold.EXCLUSIVE)

    def _unfinished_holds(self, node: WorkerController) -> tuple[Hold | None, ...]:
        units = self.assigned_work.get(node, {})
        return tuple(self._hold(scope) for scope, unit in units.items() if not all(unit.values()))

    def _others(self, node: WorkerController) -> list[OtherWorker]:
        return [
            OtherWorker(
                holds=self._unfinished_holds(other),
                waiting=other in self._waiting,
                has_tests=self._pending_of(units) > 0,
            )
            for other, units in self.assigned_work.items()
            if other is not node
        ]

    def _assign_work_unit(self, node: WorkerController) -> None:
        others = self._others(node)
        scopes = list(self.workqueue)
        index = first_beside(
            [self._hold(scope) for scope in scopes], [hold for other in others for hold in other.holds]
        )
        if index is None:
            if may_wait(self._unfinished_holds(node), others):
                if node not in self._waiting:
                    self._waiting.append(node)
                return
            index = 0  # the queue's head: it waits on its hold, the session goes on
        if node in self._waiting:
            self._waiting.remove(node)
        self.workqueue.move_to_end(scopes[index], last=False)
        super()._assign_work_unit(node)
        # what this worker was given may be what a waiting one cannot wait beside
        for waiting in [w for w in self._waiting if not may_wait(self._unfinished_holds(w), self._others(w))]:
            self._ask_again(waiting)

    def _ask_again(self, node: WorkerController) -> None:
        if node not in self._waiting:
            return
        self._waiting.remove(node)
        # each try assigns, leaves it waiting again, or (queue empty) shuts it down; a worker runs
        # a test only once it knows the next, so one given a single test is asked again at once
        # (as schedule() asks every worker twice)
        while (
            node not in self._waiting
            and not node.shutting_down
            and self._pending_of(self.assigned_work[node]) < 2
        ):
            self._reschedule(node)

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for waiting in [w for w in self._waiting if w is not node]:
            self._ask_again(waiting)

    def remove_node(self, node: WorkerController) -> str | None:
        if node in self._waiting:
            self._waiting.remove(node)
        crashed = super().remove_node(node)
        for waiting in list(self._waiting):  # the worker gone may have been what they waited on
            self._ask_again(waiting)
        return crashed
