"""What every test process shares when `make test` runs the suite on parallel workers
(pytest-xdist, ``-n 2 --dist loadscope``: a module's tests on one worker).

- One local cluster for the whole session: the first worker that needs it starts it (under a
  file lock), the main process stops it at the end if this session started it.
- Each worker hands out host ports from its own share of the test port range.
- Every module that runs processes holds the machine, and an e2e module the cluster too
  (`tests/support/session.py`), for the whole module, because a module's fixtures (its
  operator, a model its tests share, manifests applied once) live from its first test to its
  last. Modules that need the machine unloaded or load it heavily (a verdict on deadlines of a
  second or two, a second local cluster) are marked ``exclusive``: they run alone. E2e modules
  that change what the whole cluster sees (taint every node, an operator in cluster scope, an
  older CRD, a simulated node) are marked ``cluster_exclusive``: no other e2e module runs beside
  them, integration modules (processes, no cluster) may. An exclusive holder waits for the
  running ones and none starts beside it. Exclusive modules run first, one after the other, so
  that none waits for the middle of another module; then the cluster-exclusive ones, each
  followed in the queue by integration modules for the other worker to run meanwhile. Unit
  modules (pure logic) run beside anything. A worker takes the first queued module that runs
  beside what the others were given, or waits until one does, never one that would only wait
  for them (`tests/support/module_scheduler.py`).
- Every module is marked ``unit``, ``integration`` or ``e2e``; ``exclusive`` and
  ``cluster_exclusive`` mark a whole module (a test of its own module where a few tests need
  it), never one test of a shared module.

Without xdist all of this still holds, uncontended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from pdwarden_testkit import ports
from tests.support.module_durations import measured_seconds
from tests.support.module_scheduler import HoldAwareScheduling, longest_first
from tests.support.session import (
    ENV_SESSION_DIR,
    STARTED_CLUSTER,
    Hold,
    cluster_hold,
    module_path,
    session_dir,
    write_module_holds,
)

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import Scheduling


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the main process: workers inherit its environment
        os.environ[ENV_SESSION_DIR] = tempfile.mkdtemp(prefix="pdwarden-test-session-")
        return
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ[ports.ENV_PORT_RANGE] = ports.share_of_port_range(index, count)


KINDS = ("unit", "integration", "e2e")


def _module_marked(item: pytest.Item, name: str) -> bool:
    module = item.getparent(pytest.Module)
    return module is not None and module.get_closest_marker(name) is not None


EXCLUSIVE_MARKS = ("exclusive", "cluster_exclusive")


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Exclusive modules first; then the cluster-exclusive ones, interleaved with the
    integration modules (the other worker runs those meanwhile); then the other e2e modules,
    then the rest; each class longest first (tests/support/module_durations.json), in the
    shuffled order within a minute: workers take whole modules (``--no-loadscope-reorder``
    keeps this order), so exclusive modules run back to back and the session does not end with
    one worker on a long module while the other idles."""
    for item in items:
        if not any(_module_marked(item, kind) for kind in KINDS):
            raise pytest.UsageError(f"{item.path}: mark the module with one of {', '.join(KINDS)}")
        for mark in EXCLUSIVE_MARKS:
            if item.get_closest_marker(mark) is not None and not _module_marked(item, mark):
                raise pytest.UsageError(
                    f"{item.nodeid}: `{mark}` marks a whole module (the hold spans a module); "
                    f"move this test to a {mark} module of its own"
                )
        if _module_marked(item, "cluster_exclusive") and not _module_marked(item, "e2e"):
            raise pytest.UsageError(
                f"{item.path}: `cluster_exclusive` is for e2e modules (they hold the cluster)"
            )

    seconds = measured_seconds()

    def paths(predicate: Callable[[pytest.Item], bool]) -> list[str]:
        modules = dict.fromkeys(module_path(item.nodeid) for item in items if predicate(item))
        return longest_first(list(modules), seconds)

    cluster_exclusive = paths(lambda item: _module_marked(item, "cluster_exclusive"))
    integration = paths(lambda item: _module_marked(item, "integration"))
    # each cluster-exclusive module, then its share of the integration modules
    share = -(-len(integration) // max(1, len(cluster_exclusive)))
    interleaved = [
        path
        for i, module in enumerate(cluster_exclusive)
        for path in (module, *integration[i * share : (i + 1) * share])
    ]
    order = [
        *paths(lambda item: _module_marked(item, "exclusive")),
        *interleaved,
        *paths(lambda item: item.get_closest_marker("e2e") is not None),
    ]
    rank: dict[str, int] = {}
    for path in order:  # a module's first place is its place
        rank.setdefault(path, len(rank))
    items.sort(key=lambda item: rank.get(module_path(item.nodeid), len(rank)))
    if hasattr(config, "workerinput"):  # for the main process's scheduler, which does not collect
        modules = {module_path(item.nodeid): item.getparent(pytest.Module) for item in items}
        write_module_holds({path: module_hold(m) for path, m in modules.items() if m is not None})


def module_hold(module: pytest.Module) -> Hold | None:
    """What a module holds while it runs (None: a unit module, pure logic, holds nothing)."""
    if module.get_closest_marker("unit") is not None:
        return None
    if module.get_closest_marker("exclusive") is not None:
        return Hold.EXCLUSIVE
    if module.get_closest_marker("cluster_exclusive") is not None:
        return Hold.CLUSTER_EXCLUSIVE
    if module.get_closest_marker("e2e") is not None:
        return Hold.CLUSTER
    return Hold.PROCESSES


@pytest.fixture(scope="module", autouse=True)
def _hold_the_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """The module's hold (autouse: set up before its other module fixtures, torn down after)."""
    hold = module_hold(request.node)
    if hold is None:
        yield
        return
    with cluster_hold(hold):
        yield


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """`--dist loadscope` with each worker's next module picked by the holds
    (tests/support/module_scheduler.py)."""
    if config.getvalue("dist") != "loadscope":
        return None
    return HoldAwareScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or ENV_SESSION_DIR not in os.environ:
        return
    if (session_dir() / STARTED_CLUSTER).exists():
        from pdwarden_localcluster import cluster as localcluster

        localcluster.down(progress=lambda _msg: None)
    shutil.rmtree(session_dir(), ignore_errors=True)
