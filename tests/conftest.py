"""What every test process shares when `make test` runs the suite on parallel workers
(pytest-xdist, ``-n 2 --dist loadscope``: a module's tests on one worker).

- One local cluster for the whole session: the first worker that needs it starts it (under a
  file lock), the main process stops it at the end if this session started it.
- Each worker hands out host ports from its own share of the test port range.
- Tests that change what the whole cluster or machine sees (taint every node, an operator in
  cluster scope, a second local cluster, a soak whose verdict depends on an unloaded machine)
  are marked ``exclusive``: they run alone; every other test that runs processes takes a shared
  hold, so an exclusive test waits for the running ones and none starts beside it. Unit tests
  (pure logic) run beside anything.

Without xdist all of this still holds, uncontended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from pdwarden_bench import ports
from tests.support.session import ENV_SESSION_DIR, STARTED_CLUSTER, cluster_hold, session_dir


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the main process: workers inherit its environment
        os.environ[ENV_SESSION_DIR] = tempfile.mkdtemp(prefix="pdwarden-test-session-")
        return
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ[ports.ENV_PORT_RANGE] = ports.share_of_port_range(index, count)


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with multi-minute scenarios first, then the other e2e modules, then the rest,
    each class in the shuffled order: workers take whole modules (``--no-loadscope-reorder``
    keeps this order), so the session does not end with one worker on a long module while the
    other idles."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    e2e = {item.path for item in items if item.get_closest_marker("e2e") is not None}
    items.sort(key=lambda item: 0 if item.path in slow else 1 if item.path in e2e else 2)


@pytest.fixture(autouse=True)
def _hold_the_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("unit") is not None:
        yield
        return
    with cluster_hold(request.node.get_closest_marker("exclusive") is not None):
        yield


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or ENV_SESSION_DIR not in os.environ:
        return
    if (session_dir() / STARTED_CLUSTER).exists():
        from pdwarden_localcluster import cluster as localcluster

        localcluster.down(progress=lambda _msg: None)
    shutil.rmtree(session_dir(), ignore_errors=True)
