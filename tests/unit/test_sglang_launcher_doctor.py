"""The doctor's verdict on a probe report (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from pdwarden_runtime.doctor import FIXES, render_text, verdict

pytestmark = pytest.mark.unit

GOOD: dict[str, Any] = {
    "seam": {"seam": "sitecustomize", "activated": True},
    "versions": {"sglang": "0.5.23", "nixl": "1.5.1"},
    "supported": {"sglang": True, "nixl": True},
    "fixes": dict.fromkeys(FIXES, True),
    "kv_classes_hardened": True,
    "prometheus_multiprocess": True,
    "behaviour": {
        "signatures": {"ok": True},
        "sticky_failed": {"ok": True},
        "stalled_handle_no_ack": {"ok": True},
    },
    "configuration": {"fixes": sorted(FIXES), "transfer_deadline": 30.0},
}


def tree(main: dict = GOOD, scheduler: dict = GOOD) -> dict:
    return {"main": main, "scheduler": scheduler, "start_method": "spawn"}


def test_all_active_is_ok() -> None:
    report = verdict(tree())
    assert report["ok"] is True and report["problems"] == []
    assert report["fixes"] == dict.fromkeys(FIXES, True)
    assert render_text(report).endswith("hardening ACTIVE")


def test_probe_failure_is_not_ok() -> None:
    report = verdict({"probe_error": "boom"})
    assert report["ok"] is False and "boom" in report["problems"]


def test_one_fix_off_in_the_scheduler_is_not_ok() -> None:
    one_off = {**GOOD, "fixes": {**dict.fromkeys(FIXES, True), "transfer_deadline": False}}
    report = verdict(tree(scheduler=one_off))
    assert report["ok"] is False
    assert report["problems"] == ["scheduler process: fixes not active: transfer_deadline"]
    assert report["fixes"]["transfer_deadline"] is False
    assert "NO  fix transfer_deadline" in render_text(report)


def test_unsupported_version_is_not_ok() -> None:
    old = {
        **GOOD,
        "versions": {"sglang": "0.5.9", "nixl": "1.5.1"},
        "supported": {"sglang": False, "nixl": True},
    }
    report = verdict(tree(old, old))
    assert "sglang 0.5.9 is not a version pdwarden supports" in report["problems"]


def test_sglang_classes_not_replaced_is_not_ok() -> None:
    report = verdict(tree(scheduler={**GOOD, "kv_classes_hardened": False}))
    assert any("get_kv_class" in p for p in report["problems"])


def test_not_activated_names_the_error() -> None:
    failed = {**GOOD, "seam": {"seam": "sitecustomize", "activated": False, "error": "ImportError: x"}}
    report = verdict(tree(main=failed))
    assert (
        "main process: hardening not activated when SGLang's NIXL backend loaded (ImportError: x)"
        in report["problems"]
    )


def test_no_multiprocess_metrics_is_not_ok() -> None:
    report = verdict(tree(scheduler={**GOOD, "prometheus_multiprocess": False}))
    assert any("multiprocess mode" in p for p in report["problems"])


def test_a_failed_behaviour_check_is_not_ok_and_names_the_problem() -> None:
    bad = {
        **GOOD,
        "behaviour": {
            **GOOD["behaviour"],
            "stalled_handle_no_ack": {
                "ok": False,
                "problems": ["decode was told its pages are free while the handle could still write"],
            },
        },
    }
    report = verdict(tree(scheduler=bad))
    assert report["ok"] is False
    assert report["problems"] == [
        "behaviour stalled_handle_no_ack: decode was told its pages are free "
        "while the handle could still write"
    ]
    assert "NO  behaviour stalled_handle_no_ack" in render_text(report)
    assert report["configuration"]["transfer_deadline"] == 30.0
