"""bench/gpu_pd_check.sh without a GPU: its --dry-run (model + tokenizer made on
the spot and loaded by SGLang's own loaders; the launcher's SGLang arguments checked by
SGLang's parser)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdwarden_operator.render.router import ROUTER_RESILIENCE_ARGS

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_pd_check.sh"


def test_dry_run_prepares_everything_but_the_gpu() -> None:
    env = {**os.environ, "PDWARDEN_PYTHON": sys.executable}
    done = subprocess.run(
        [str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=600, check=False, env=env
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "dry run ok" in out
    assert "SGLang's loaders agree" in out
    for role in ("prefill", "decode"):
        assert (
            f"arguments added to SGLang: --disaggregation-mode {role} --disaggregation-transfer-backend nixl"
            in out
        )
        assert f"runtime serve --role {role} --engine sglang" in out
    assert "--load-format dummy" in out
    rendered = " ".join(ROUTER_RESILIENCE_ARGS)
    assert f"-m smg.launch_router {rendered} --pd-disaggregation" in out
    # the work directory (model, tokenizer) is removed afterwards
    work = [
        line.split("work directory: ")[1].strip() for line in out.splitlines() if "work directory: " in line
    ]
    assert work and not Path(work[0]).exists()
