"""The result a scenario child process prints last: one JSON line with an ``ok`` field."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def last_json_result(proc: subprocess.Popen[str], timeout: float, name: str = "") -> dict[str, Any]:
    """Wait for `proc` (killed after `timeout` seconds) and return its last JSON line, which
    must say ``ok``; a missing line fails with the child's output tails."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    prefix = f"{name}: " if name else ""
    assert lines, f"{prefix}no result (rc={proc.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["ok"], result.get("error")
    return result
