"""The hardening in SGLang's real NIXL classes, in-process (prefill + decode managers,
real NIXL over UCX on DRAM): each fix shown failing without it and holding with it.

The scenarios run in a subprocess (``tests.support.transfer_scenarios``, on the loopback pair
the runtime doctor uses too): SGLang's NIXL threads never exit, and its runtime context is
process-wide.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_testkit.ports import free_port
from tests.support.child_result import last_json_result

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

ORDER = "roundtrip,race,prefill-abort,stall"  # stall last: without C it blocks a worker for good


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    """Both modes at once (two processes): the machine is small, the waits are long."""
    procs = {
        mode: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.transfer_scenarios",
                ORDER,
                "--hardening",
                mode,
                "--port",
                str(free_port()),
                "--transfer-deadline",
                "1.0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for mode in ("on", "emulated-port")
    }
    try:
        return {mode: last_json_result(proc, 600, mode) for mode, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def hardened(results: dict[str, dict]) -> dict:
    return results["on"]


@pytest.fixture(scope="module")
def legacy(results: dict[str, dict]) -> dict:
    return results["emulated-port"]


def test_roundtrip_moves_and_verifies_data(hardened: dict) -> None:
    rooms = hardened["roundtrip"]["rooms"]
    assert [(r["prefill"], r["decode"], r["data_ok"]) for r in rooms] == [("Success", "Success", True)] * 3
    assert hardened["roundtrip"]["transfer_infos"] == 0


def test_emulated_port_race_wedges_without_hardening(legacy: dict) -> None:
    race = legacy["race"]
    # The emulated port's bug, replayed in SGLang's own worker: the ABORT's Failed was
    # overwritten by the chunk's late Transferring, the last chunk was skipped silently.
    assert race["prefill_final"] == "Transferring"
    assert race["prefill_rooms"] == {"4242": "Transferring"}
    assert race["refused"] == {}


def test_emulated_port_race_concludes_failed_with_hardening(hardened: dict) -> None:
    race = hardened["race"]
    assert race["prefill_final"] == "Failed"
    assert race["refused"].get("Failed->Transferring") == 1
    assert race["decode_status"] == "Failed"


def test_prefill_abort_tells_decode_only_with_hardening(hardened: dict, legacy: dict) -> None:
    assert legacy["prefill-abort"]["decode_told"] is False
    assert legacy["prefill-abort"]["decode_status"] == "WaitingForInput"
    assert hardened["prefill-abort"]["decode_told"] is True
    assert hardened["prefill-abort"]["decode_status"] == "Failed"
    assert hardened["prefill-abort"]["failure_notices"] >= 1


def test_stalled_handle_blocks_worker_without_hardening(legacy: dict) -> None:
    stall = legacy["stall"]
    assert stall["stalled_room"]["concluded"] is False
    assert stall["stalled_room"]["prefill"] == "Transferring"
    # the next room on the same worker never moves either
    assert stall["next_room"]["prefill"] != "Success"


def test_stalled_handle_fails_room_and_frees_worker_with_hardening(hardened: dict) -> None:
    stall = hardened["stall"]
    assert stall["stalled_room"]["concluded"] is True
    assert stall["stalled_room"]["prefill"] == "Failed"
    # the handle may still write: decode is not told while it is quarantined ...
    assert stall["stalled_room"]["decode_while_quarantined"] == "WaitingForInput"
    assert stall["stalled_room"]["quarantined"] >= 1
    # ... and is told once it settled
    assert stall["stalled_room"]["decode_after"] == "Failed"
    assert stall["stalled_room"]["quarantined_after"] == 0
    assert stall["handle_deadlines"] == 1
    assert stall["outcomes"].get("deadline") == 1
    assert stall["next_room"] == {"prefill": "Success", "decode": "Success"}
