"""The operator's process tunes the cyclic garbage collector once started: what start-up built
is frozen out of its scans, and the young generation waits for GC_YOUNG_THRESHOLD allocations."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from pdwarden_operator import cli

pytestmark = pytest.mark.unit


@pytest.fixture
def restored_gc() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


@pytest.mark.usefixtures("restored_gc")
def test_start_up_objects_are_frozen_and_young_collections_are_rarer() -> None:
    gc.unfreeze()
    built_at_start = [["state"] for _ in range(10)]
    assert any(o is built_at_start[0] for o in gc.get_objects())
    _young, middle, old = gc.get_threshold()
    cli._quiet_gc()
    frozen = {id(built) for built in built_at_start}
    assert not any(id(o) in frozen for o in gc.get_objects())  # the frozen generation is not listed
    assert gc.get_threshold() == (cli.GC_YOUNG_THRESHOLD, middle, old)
    assert cli.GC_YOUNG_THRESHOLD > 700  # Python's default


@pytest.mark.usefixtures("restored_gc")
def test_cycles_made_after_start_up_are_still_collected() -> None:
    cli._quiet_gc()

    class Node:
        peer: object = None

    a, b = Node(), Node()
    a.peer, b.peer = b, a
    del a, b
    assert gc.collect() >= 2
