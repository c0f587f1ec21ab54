"""The test session's shared state when parallel workers run it (tests/conftest.py): a
directory every worker knows, and the hold that keeps ``exclusive`` tests alone."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV_SESSION_DIR = "PDWARDEN_TEST_SESSION_DIR"
STARTED_CLUSTER = "started-cluster"  # in the session dir: this session started the local cluster


def session_dir() -> Path:
    return Path(os.environ[ENV_SESSION_DIR])


@contextmanager
def cluster_hold(exclusive: bool) -> Iterator[None]:
    """A shared or an exclusive hold on the cluster and the machine. An exclusive request keeps
    the gate while it waits for the shared holders to end, so that no new one starts meanwhile.
    Closing the hold's file gives the hold back."""
    with open(session_dir() / "gate", "a+") as gate, open(session_dir() / "hold", "a+") as hold:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(hold, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield
