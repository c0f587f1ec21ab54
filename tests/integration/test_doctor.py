"""`pdwarden runtime doctor --engine sglang`: fresh processes, SGLang's spawn path, real SGLang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_runtime.doctor import FIXES, run_probe, verdict
from pdwarden_runtime.sglang_boot import seam_env
from pdwarden_runtime.sglang_boot.activate import EXIT_ACTIVATION_FAILED

pytestmark = pytest.mark.integration

# generous: on a loaded 2-core machine importing SGLang twice can take minutes
TIMEOUT = 600


def doctor_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = "import sys; from pdwarden_runtime.doctor import doctor; doctor(sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *args, "--timeout", str(TIMEOUT)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT + 60,
        env=env,
        check=False,
    )


def test_doctor_finds_every_fix_active_in_the_spawned_scheduler() -> None:
    # the pod's own configuration (the launcher's PDWARDEN_HARDENING_CONFIG) is what is checked
    pod_config = json.dumps({"engine": "sglang", "transfer_deadline": 12.5, "inflight_deadline": 90})
    done = doctor_cli(
        "--engine", "sglang", "--json", env={**os.environ, "PDWARDEN_HARDENING_CONFIG": pod_config}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True and report["problems"] == []
    assert report["sglang"] == {"version": "0.5.23", "supported": True}
    assert report["nixl"] == {"version": "1.5.1", "supported": True}
    assert report["start_method"] == "spawn"
    assert report["seam"] == "sitecustomize"
    assert report["fixes"] == dict.fromkeys(FIXES, True)
    # behaviour, on SGLang's real classes in the spawned child
    assert report["behaviour"] == {
        "signatures": True,
        "sticky_failed": True,
        "stalled_handle_no_ack": True,
        "held_pages_need_proof": True,
    }
    assert report["configuration"]["transfer_deadline"] == 12.5
    assert report["configuration"]["inflight_deadline"] == 90
    main, scheduler = report["processes"]["main"], report["processes"]["scheduler"]
    assert main["pid"] != scheduler["pid"]
    assert scheduler["nixl_backend_loaded_before_lookup"] is False  # armed, not loaded
    assert scheduler["exitcode"] == 0
    for proc in (main, scheduler):
        assert proc["seam"]["activated"] is True
        assert proc["nixl_kv_classes"]["manager"] == "pdwarden_runtime.hardening.nixl.HardenedNixlKVManager"
        assert proc["prometheus_multiprocess"] is True


def test_without_the_seam_the_probe_finds_nothing_active(tmp_path: Path) -> None:
    """The same probe in a plain environment: proves activation comes from the seam."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDWARDEN_")}
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)
    report = verdict(run_probe(env, TIMEOUT))
    assert report["ok"] is False
    assert report["fixes"] == dict.fromkeys(FIXES, False)
    assert any("scheduler process: hardening not activated" in p for p in report["problems"])
    kv = report["processes"]["scheduler"]["nixl_kv_classes"]
    assert kv["manager"] == "sglang.srt.disaggregation.nixl.conn.NixlKVManager"


def test_a_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (theirs / "sitecustomize.py").write_text(
        f"import os, pathlib\npathlib.Path({str(marks)!r}, str(os.getpid())).write_text('ran')\n"
    )
    prom = tmp_path / "prom"
    prom.mkdir()
    env = seam_env(
        {**os.environ, "PYTHONPATH": str(theirs)}, {"engine": "sglang"}, prom_dir=str(prom), on_error="record"
    )
    tree = run_probe(env, TIMEOUT)
    report = verdict(tree)
    assert report["ok"] is True, report["problems"]
    pids = {tree["main"]["pid"], tree["scheduler"]["pid"]}
    assert pids <= {int(p.name) for p in marks.iterdir()}


def test_failed_activation_stops_the_process_with_a_clear_message(tmp_path: Path) -> None:
    env = seam_env(os.environ, {"fault": "no-such-fault"}, prom_dir=str(tmp_path), on_error="exit")
    code = "import sglang.srt.disaggregation.nixl; print('served unhardened')"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == EXIT_ACTIVATION_FAILED
    assert "served unhardened" not in done.stdout
    assert "could not activate the NIXL hardening" in done.stderr
    assert "no-such-fault" in done.stderr


def test_arming_alone_loads_nothing_heavy(tmp_path: Path) -> None:
    """A process of the tree that never touches NIXL (detokenizer, resource tracker) stays light."""
    env = seam_env(os.environ, {"engine": "sglang"}, prom_dir=str(tmp_path), on_error="exit")
    code = (
        "import sys; from pdwarden_runtime.sglang_boot.activate import STATE; "
        "print(STATE['armed'], STATE['attempted'], 'torch' in sys.modules, 'sglang' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "False", "False"]
