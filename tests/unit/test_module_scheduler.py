"""How the test session queues modules and which one a worker takes next
(tests/support/module_scheduler.py): pure choices over holds and measured durations, and the
scheduler driven through xdist's protocol by a simulated session (no processes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdist.remote import Producer
from xdist.workermanage import WorkerController

from tests.support.module_scheduler import (
    HoldAwareScheduling,
    OtherWorker,
    first_beside,
    longest_first,
    may_wait,
)
from tests.support.session import Hold, module_path, runs_beside

pytestmark = pytest.mark.unit


def test_a_worker_is_given_the_first_module_that_runs_beside_the_others() -> None:
    queue = [Hold.CLUSTER_EXCLUSIVE, Hold.CLUSTER, Hold.PROCESSES, None]
    assert first_beside(queue, [Hold.CLUSTER_EXCLUSIVE]) == 2  # integration beside it, not e2e
    assert first_beside(queue, [Hold.EXCLUSIVE]) == 3  # only a unit module beside an exclusive one
    assert first_beside(queue, [Hold.CLUSTER, Hold.PROCESSES]) == 1  # all assigned elsewhere count
    assert first_beside(queue, []) == 0
    assert first_beside([Hold.EXCLUSIVE, Hold.CLUSTER], [Hold.EXCLUSIVE]) is None  # none runs beside


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


def test_a_worker_may_wait_only_beside_a_worker_that_runs_and_only_on_holds_that_run_beside() -> None:
    running = OtherWorker(holds=(Hold.CLUSTER_EXCLUSIVE,), waiting=False, has_tests=True)
    assert may_wait([Hold.PROCESSES], [running])
    assert may_wait([], [running])  # a worker that holds nothing yet
    # what it still holds would stop the other's module: it must be given work, and so let go
    assert not may_wait([Hold.CLUSTER], [running])
    # no other worker whose tests' ends would ask it again
    assert not may_wait([Hold.PROCESSES], [OtherWorker(holds=(), waiting=False, has_tests=False)])
    assert not may_wait([Hold.PROCESSES], [OtherWorker(holds=(Hold.CLUSTER,), waiting=True, has_tests=True)])
    assert not may_wait([None], [])


# xdist's side of the protocol, for the scheduler alone: a worker runs a test only once it knows
# the next one (or is shutting down); its module's hold starts with the module's first test and
# ends with its last (the module's teardown), and is taken only beside the holds others have.
@dataclass(eq=False)
class _Worker:
    name: str
    sent: list[int] = field(default_factory=list)
    ran: int = 0
    holding: str | None = None  # the module whose hold it has
    shutting_down: bool = False

    @property
    def gateway(self) -> SimpleNamespace:  # xdist names a worker by its gateway's id
        return SimpleNamespace(id=self.name)

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


@dataclass
class _Session:
    modules: dict[str, tuple[Hold | None, int]]  # module -> (its hold, its tests), in queue order
    workers: int
    scheduler: HoldAwareScheduling = field(init=False)
    nodes: list[_Worker] = field(init=False)
    collection: list[str] = field(init=False)
    # modules a worker was given while another worker had one it cannot run beside
    contested: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        config = SimpleNamespace(
            getvalue=lambda name: [f"{self.workers}*popen"], option=SimpleNamespace(loadscopereorder=False)
        )
        holds = {module: hold for module, (hold, _) in self.modules.items()}
        quiet = Producer("scheduler", enabled=False)
        self.scheduler = HoldAwareScheduling(cast(pytest.Config, config), quiet, holds=holds)
        self.collection = [f"{m}::t{i}" for m, (_, tests) in self.modules.items() for i in range(tests)]
        self.nodes = [_Worker(f"gw{i}") for i in range(self.workers)]
        for node in self.nodes:
            self.scheduler.add_node(cast(WorkerController, node))
            self.scheduler.add_node_collection(cast(WorkerController, node), self.collection)
        self.scheduler.schedule()
        self._note_contested()

    def _unfinished(self, node: _Worker) -> set[str]:
        return {self._module(i) for i in node.sent[node.ran :]} | ({node.holding} if node.holding else set())

    def _note_contested(self) -> None:
        """Note each module given to a worker that cannot run beside one another worker has."""
        for node in self.nodes:
            for other in self.nodes:
                if other is not node:
                    for module in self._unfinished(node):
                        if not all(
                            runs_beside(self.modules[module][0], self.modules[m][0])
                            for m in self._unfinished(other)
                        ):
                            self.contested.add(module)

    def _module(self, index: int) -> str:
        return module_path(self.collection[index])

    def runnable(self) -> list[_Worker]:
        ready = []
        for node in self.nodes:
            if node.ran >= len(node.sent) or not (node.ran + 1 < len(node.sent) or node.shutting_down):
                continue
            module = self._module(node.sent[node.ran])
            others = [self.modules[o.holding][0] for o in self.nodes if o is not node and o.holding]
            if node.holding == module or all(runs_beside(self.modules[module][0], h) for h in others):
                ready.append(node)
        return ready

    def step(self, node: _Worker) -> None:
        index = node.sent[node.ran]
        node.holding = self._module(index)
        node.ran += 1
        following = node.sent[node.ran] if node.ran < len(node.sent) else None
        if following is None or self._module(following) != node.holding:
            node.holding = None  # the module's teardown
        self.scheduler.mark_test_complete(cast(WorkerController, node), index)
        self._note_contested()
        if self.scheduler.tests_finished:
            for other in self.nodes:
                other.shutdown()

    def run(self, choose: Callable[[list[_Worker]], _Worker]) -> list[str]:
        """Every test that ran, sorted; fails on a stall (tests left, none can run)."""
        while sum(n.ran for n in self.nodes) < len(self.collection):
            ready = self.runnable()
            assert ready, f"stalled: {[(n.name, n.sent[n.ran :], n.holding) for n in self.nodes]}"
            self.step(choose(ready))
        return sorted(self.collection[i] for n in self.nodes for i in n.sent[: n.ran])


_HOLDS = st.sampled_from([None, Hold.PROCESSES, Hold.CLUSTER, Hold.CLUSTER_EXCLUSIVE, Hold.EXCLUSIVE])


@settings(max_examples=300, deadline=None)
@given(
    holds=st.lists(st.tuples(_HOLDS, st.integers(1, 4)), min_size=1, max_size=12),
    workers=st.integers(2, 3),
    data=st.data(),
)
def test_every_test_runs_once_whatever_the_holds_and_whichever_worker_is_quicker(
    holds: list[tuple[Hold | None, int]], workers: int, data: st.DataObject
) -> None:
    modules = {f"m{i}.py": entry for i, entry in enumerate(holds)}
    session = _Session(modules, workers)
    ran = session.run(lambda ready: data.draw(st.sampled_from(ready)))
    assert ran == sorted(session.collection)


def test_a_worker_waits_for_a_module_it_can_run_beside_rather_than_one_it_would_wait_out() -> None:
    # gw0 is given the cluster-exclusive module, then the long e2e one; only e2e modules are
    # left for gw1, which is left waiting (its integration module's last test with it) until
    # the cluster-exclusive module ends, rather than handed one that would wait it out
    session = _Session(
        {
            "integration_a.py": (Hold.PROCESSES, 2),
            "integration_b.py": (Hold.PROCESSES, 2),
            "cluster_exclusive.py": (Hold.CLUSTER_EXCLUSIVE, 1),
            "e2e_long.py": (Hold.CLUSTER, 3),
            "e2e_short.py": (Hold.CLUSTER, 1),
        },
        workers=2,
    )
    ran = session.run(lambda ready: ready[0])
    assert ran == sorted(session.collection)
    assert session.contested == set()
