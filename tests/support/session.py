"""The test session's shared state when parallel workers run it (tests/conftest.py): a
directory every worker knows, and the holds that keep ``exclusive`` modules alone and
``cluster_exclusive`` ones away from every other user of the cluster."""

from __future__ import annotations

import enum
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ENV_SESSION_DIR = "PDWARDEN_TEST_SESSION_DIR"
STARTED_CLUSTER = "started-cluster"  # in the session dir: this session started the local cluster
MODULE_HOLDS = "module-holds.json"  # in the session dir: each module's hold, as the workers collected it


def session_dir() -> Path:
    return Path(os.environ[ENV_SESSION_DIR])


class Hold(enum.Enum):
    """What a module holds while it runs: the machine (every module that runs processes) and
    the cluster (the e2e ones; None: not held), each exclusively (True) or shared."""

    PROCESSES = (False, None)  # integration: processes on the machine, no cluster
    CLUSTER = (False, False)  # e2e
    CLUSTER_EXCLUSIVE = (False, True)  # e2e that changes what the whole cluster sees
    EXCLUSIVE = (True, True)  # needs the machine unloaded, or loads it heavily


def runs_beside(a: Hold | None, b: Hold | None) -> bool:
    """Whether modules holding `a` and `b` (None: a unit module, which holds nothing) can run at
    once: what the locks below let pass."""
    if a is None or b is None:
        return True
    (machine_a, cluster_a), (machine_b, cluster_b) = a.value, b.value
    if machine_a or machine_b:
        return False
    return cluster_a is None or cluster_b is None or not (cluster_a or cluster_b)


def module_path(nodeid: str) -> str:
    """The module of a node id or an xdist work unit (a module, or a class in one): the key of
    the module holds map."""
    return nodeid.split("::", 1)[0]


def write_module_holds(holds: Mapping[str, Hold | None]) -> None:
    """Each module's hold by its path (as in a node id), for the scheduler of the main process,
    which does not collect. Every worker collects the same modules: the last write stands."""
    target = session_dir() / MODULE_HOLDS
    scratch = target.with_name(f"{target.name}.{os.getpid()}")
    scratch.write_text(json.dumps({path: hold.name if hold else None for path, hold in holds.items()}))
    scratch.replace(target)


def read_module_holds() -> dict[str, Hold | None]:
    """What write_module_holds wrote; empty before any worker collected."""
    try:
        names = json.loads((session_dir() / MODULE_HOLDS).read_text())
    except FileNotFoundError:
        return {}
    return {path: Hold[name] if name else None for path, name in names.items()}


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
