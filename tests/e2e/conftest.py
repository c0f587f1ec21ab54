"""Fixtures of the e2e tests: the embedded local cluster, kubectl, a fresh namespace.

`cluster` reuses a cluster that is already up (and leaves it up) or starts one, which the
session stops at its end (tests/conftest.py: parallel workers share it). While the session
runs, KUBECONFIG points at it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdwarden_localcluster import build, tools
from pdwarden_localcluster import cluster as localcluster
from pdwarden_localcluster.cluster import ClusterInfo
from pdwarden_localcluster.errors import ClusterError
from pdwarden_testkit.cluster_env import Env, open_env
from pdwarden_testkit.kubectl import Kubectl, create_namespace, unique_namespace
from tests.support.session import STARTED_CLUSTER, session_dir


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterInfo]:
    try:
        # both lock: one worker installs and starts, the others then find everything up
        tools.install(progress=False)
        info = localcluster.ensure_up()
        if info.started:  # before anything else can fail: the session's end stops what it started
            (session_dir() / STARTED_CLUSTER).touch()
        # the monitoring stack's binaries too, before any test runs (`make test` built them all
        # first, `make binaries`: a hit costs a stat; a miss here builds for minutes under this
        # test's time limit)
        build.ensure_monitoring_built()
    except ClusterError as exc:
        pytest.fail(f"the local cluster cannot start: {exc}", pytrace=False)
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(info.kubeconfig)
    try:
        yield info
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterInfo) -> Kubectl:
    return Kubectl(cluster.kubeconfig)


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for one test, deleted afterwards (its pods' processes stop)."""
    name = create_namespace(kubectl, unique_namespace(request.node.name))
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def env(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Iterator[Env]:
    """The watchdog scenarios' handle on the cluster: API calls, models, operator processes
    (stopped afterwards)."""
    yield from open_env(Path(cluster.kubeconfig), namespace, tmp_path)
