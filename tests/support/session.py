"""The test session's shared state when parallel workers run it (tests/conftest.py): a
directory every worker knows, and the holds that keep ``exclusive`` modules alone and
``cluster_exclusive`` ones away from every other user of the cluster."""

from __future__ import annotations

import enum
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_SESSION_DIR = "PDWARDEN_TEST_SESSION_DIR"
STARTED_CLUSTER = "started-cluster"  # in the session dir: this session started the local cluster


def session_dir() -> Path:
    return Path(os.environ[ENV_SESSION_DIR])


class Hold(enum.Enum):
    """What a module holds while it runs: the machine (every module that runs processes) and
    the cluster (the e2e ones; None: not held), each exclusively (True) or shared."""

    PROCESSES = (False, None)  # integration: processes on the machine, no cluster
    CLUSTER = (False, False)  # e2e
    CLUSTER_EXCLUSIVE = (False, True)  # e2e that changes what the whole cluster sees
    EXCLUSIVE = (True, True)  # needs the machine unloaded, or loads it heavily


@contextmanager
def _lock(name: str, exclusive: bool) -> Iterator[None]:
    """One of the session's locks, shared or exclusive. An exclusive request keeps the lock's
    gate while it waits for the shared holders to end, so that no new one starts meanwhile.
    Closing the lock's file gives it back."""
    with open(session_dir() / f"{name}-gate", "a+") as gate, open(session_dir() / name, "a+") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@contextmanager
def cluster_hold(hold: Hold) -> Iterator[None]:
    """The machine's lock, then (e2e) the cluster's: always in that order, so no two holders
    wait for each other."""
    machine, cluster = hold.value
    with _lock("machine", machine):
        if cluster is None:
            yield
            return
        with _lock("cluster", cluster):
            yield
