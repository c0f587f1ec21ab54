"""What every test process shares when `make test` runs the suite on parallel workers
(pytest-xdist, ``-n 2 --dist loadscope``: a module's tests on one worker).

- One local cluster for the whole session: the first worker that needs it starts it (under a
  file lock), the main process stops it at the end if this session started it.
- Each worker hands out host ports from its own share of the test port range.
- Modules that change what the whole cluster or machine sees (taint every node, an operator in
  cluster scope, an older CRD, a second local cluster, a soak whose verdict depends on an
  unloaded machine) are marked ``exclusive``: they run alone. Every other module that runs
  processes takes a shared hold. A hold spans the whole module, because a module's fixtures
  (its operator, a model its tests share, manifests applied once) live on the cluster from its
  first test to its last: an exclusive module waits for the running ones and none starts beside
  it. Exclusive modules run first, one after the other, so that none waits for the middle of
  another module. Unit modules (pure logic) run beside anything.
- Every module is marked ``unit``, ``integration`` or ``e2e``; ``exclusive`` marks a whole module
  (a test of its own module where a few tests need it), never one test of a shared module.

Without xdist all of this still holds, uncontended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from pdwarden_testkit import ports
from tests.support.session import ENV_SESSION_DIR, STARTED_CLUSTER, cluster_hold, session_dir


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


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Exclusive modules first, then the modules with multi-minute scenarios, then the other
    e2e modules, then the rest, each class in the shuffled order: workers take whole modules
    (``--no-loadscope-reorder`` keeps this order), so exclusive modules run back to back and
    the session does not end with one worker on a long module while the other idles."""
    for item in items:
        if not any(_module_marked(item, kind) for kind in KINDS):
            raise pytest.UsageError(f"{item.path}: mark the module with one of {', '.join(KINDS)}")
        if item.get_closest_marker("exclusive") is not None and not _module_marked(item, "exclusive"):
            raise pytest.UsageError(
                f"{item.nodeid}: `exclusive` marks a whole module (the hold spans a module); "
                "move this test to an exclusive module of its own"
            )

    exclusive = {item.path for item in items if _module_marked(item, "exclusive")}
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    e2e = {item.path for item in items if item.get_closest_marker("e2e") is not None}
    order = (exclusive, slow, e2e)
    items.sort(key=lambda item: next((i for i, paths in enumerate(order) if item.path in paths), len(order)))


@pytest.fixture(scope="module", autouse=True)
def _hold_the_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """The module's hold (autouse: set up before its other module fixtures, torn down after)."""
    module = request.node
    if module.get_closest_marker("unit") is not None:
        yield
        return
    with cluster_hold(module.get_closest_marker("exclusive") is not None):
        yield


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or ENV_SESSION_DIR not in os.environ:
        return
    if (session_dir() / STARTED_CLUSTER).exists():
        from pdwarden_localcluster import cluster as localcluster

        localcluster.down(progress=lambda _msg: None)
    shutil.rmtree(session_dir(), ignore_errors=True)
