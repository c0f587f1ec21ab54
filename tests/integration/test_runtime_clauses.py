"""One check per runtime clause, on SGLang's real NIXL classes in a child process:
an exception in a pdwarden hook leaves the transfer worker running; a chunk enqueued for a
live room that lost its transfer info fails the room (SGLang drops it silently: shown on
the emulated port); a decode whose prefill went silent fails the room by its deadline and
keeps the pages for the abort-and-drain release; a dead transfer worker is seen; a decode
that gives up before sending its metadata ends the prefill's room, even one the prefill
opens only afterwards; a room whose decode leg never comes is bounded by the deadline."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdwarden_testkit.ports import free_port
from tests.support.child_result import last_json_result

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

INFLIGHT_DEADLINE = 2.0


def _run(scenarios: str, hardening: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.transfer_scenarios",
            scenarios,
            "--hardening",
            hardening,
            "--port",
            str(free_port()),
            "--transfer-deadline",
            "1.0",
            "--inflight-deadline",
            str(INFLIGHT_DEADLINE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,  # where `tests` is importable
    )


@pytest.fixture(scope="module")
def results() -> Iterator[dict[str, dict[str, Any]]]:
    procs = {
        "on": _run(
            "abort-before-metadata,early-abort,bootstrap-deadline,hook-error,enqueue-popped,"
            "prefill-vanished,dead-worker",
            "on",
        ),
        "emulated-port": _run("enqueue-popped,early-abort", "emulated-port"),
    }
    try:
        yield {mode: last_json_result(proc, 240) for mode, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_an_exception_in_a_hook_is_counted_and_the_worker_lives_on(results: dict) -> None:
    run = results["on"]["hook-error"]
    assert run["rooms"] == [{"prefill": "Success", "decode": "Success"}] * 3
    assert run["errors"].get("chunk_taken") == 1 and run["errors"].get("chunk_finished") == 1
    assert run["errors"].get("enqueue") == 1
    assert run["threads_dead"] == {}


def test_an_enqueue_for_a_room_without_transfer_info_fails_the_room(results: dict) -> None:
    hardened = results["on"]["enqueue-popped"]
    assert hardened["concluded"] and hardened["prefill"] == "Failed"
    assert hardened["decode_told"] and hardened["decode"] == "Failed"
    control = results["emulated-port"]["enqueue-popped"]
    assert control["concluded"] is False and control["decode_told"] is False  # SGLang's silent drop


def test_a_decode_whose_prefill_went_silent_fails_by_its_deadline(results: dict) -> None:
    run = results["on"]["prefill-vanished"]
    assert run["concluded"] and run["decode"] == "Failed"
    assert run["decode_outcomes"].get("deadline") == 1
    assert run["abort_notified"] is True and run["still_marked"] is False, run


def test_a_dead_transfer_worker_is_seen(results: dict) -> None:
    run = results["on"]["dead-worker"]
    workers = run["before"]["expected"]["nixl_transfer_worker"]
    assert run["before"]["alive"]["nixl_transfer_worker"] == workers
    assert run["dead"]["nixl_transfer_worker"] == [workers - 1, workers]
    # the scenario before it stopped the prefill's deadline reaper: seen as well
    assert run["dead"]["pdwarden_deadline_reaper"] == [0, 1]


def test_a_decode_abort_before_its_metadata_fails_the_waiting_prefill_room(results: dict) -> None:
    run = results["on"]["abort-before-metadata"]
    assert run["failed"] and run["prefill"] == "Failed" and run["seconds"] < 2.0, run
    assert "abort" in (run["reason"] or "").lower()


def test_an_abort_for_a_room_the_prefill_does_not_have_yet_fails_it_when_it_opens(results: dict) -> None:
    run = results["on"]["early-abort"]
    assert run["failed"] and run["prefill"] == "Failed", run
    assert run["reason"] == "Aborted by decode before this prefill opened the room"
    control = results["emulated-port"]["early-abort"]  # SGLang drops it: the room waits
    assert control["failed"] is False and control["prefill"] == "Bootstrapping", control


def test_a_room_whose_decode_leg_never_comes_fails_by_the_inflight_deadline(results: dict) -> None:
    run = results["on"]["bootstrap-deadline"]
    assert run["bootstrap_timeout"] == INFLIGHT_DEADLINE
    assert run["failed"] and INFLIGHT_DEADLINE - 0.5 <= run["seconds"] <= INFLIGHT_DEADLINE + 3, run
    assert run["outcomes"].get("deadline") == 1, run
