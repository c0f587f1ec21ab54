"""`pdwarden runtime serve --engine sglang` with real SGLang processes (CPU: SGLang starts,
spawns its scheduler, and is stopped or fails; serving a model needs the GPU check)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from pdwarden_localcluster import procs
from pdwarden_localcluster.waits import wait_for
from pdwarden_runtime.sglang_boot import SITE_DIR
from pdwarden_testkit.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PDW = [
    sys.executable,
    "-c",
    "import sys; from pdwarden_cli.main import main; sys.argv[0] = 'pdwarden'; main()",
]
START_TIMEOUT = 600  # generous: SGLang start-up on a loaded 2-core machine is slow


def tiny_model(directory: Path) -> Path:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_pd_check
    finally:
        sys.path.pop(0)
    gpu_pd_check.make_model(directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
    )
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def group_alive(pgid: int) -> bool:
    """Whether a live (non-zombie) process of group ``pgid`` remains."""
    return bool(procs.group_members(pgid, not_before=0))


def serve(args: list[str], sglang_args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PDW, "runtime", "serve", "--engine", "sglang", *args, "--", *sglang_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_launcher_runs_sglang_hardened_and_stops_its_whole_tree(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    metrics_port = free_port()
    proc = serve(
        [
            "--role",
            "decode",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--bootstrap-port",
            str(free_port()),
            "--metrics-port",
            str(metrics_port),
        ],
        [
            "--model-path",
            str(model),
            "--load-format",
            "dummy",
            "--device",
            "cpu",
            "--cuda-graph-backend-decode",
            "disabled",
            "--cuda-graph-backend-prefill",
            "disabled",
        ],
    )
    sglang_pid: int | None = None
    try:

        def sglang_spawned() -> tuple[int, list[int]] | None:
            if proc.poll() is not None:
                raise AssertionError(proc.stdout.read() if proc.stdout else "the launcher exited")
            for kid in children(proc.pid)[:1]:
                spawned = children(kid)
                if any(
                    "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                    for p in spawned
                    if Path(f"/proc/{p}").exists()
                ):
                    return kid, spawned
            return None

        sglang_pid, spawned = wait_for(
            sglang_spawned, START_TIMEOUT, "SGLang to spawn its processes", 1.0, (OSError,)
        )
        # the contract metrics port is up while SGLang starts
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as resp:
            assert resp.status == 200
        # SGLang's main and its spawned children carry the seam
        for pid in [sglang_pid, *spawned]:
            env = environ_of(pid)
            assert env["PDWARDEN_HARDENING"] == "1"
            assert env["PYTHONPATH"].split(os.pathsep)[0] == str(SITE_DIR)
            assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/tmp/pdwarden-decode-prom-")
        prom_dir = environ_of(sglang_pid)["PROMETHEUS_MULTIPROC_DIR"]
        cmdline = Path(f"/proc/{sglang_pid}/cmdline").read_text().split("\0")
        assert cmdline[1:3] == ["-m", "sglang.launch_server"]
        assert cmdline[3:5] == ["--disaggregation-mode", "decode"]

        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if sglang_pid is not None and group_alive(sglang_pid):
            os.killpg(sglang_pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert (
        "arguments added to SGLang: --disaggregation-mode decode --disaggregation-transfer-backend nixl"
        in out
    )
    assert f"your SGLang arguments (untouched): --model-path {model}" in out
    # SIGKILLed children take a moment to be reaped; the bound is generous, not a timing claim
    pgid: int = sglang_pid
    wait_for(lambda: not group_alive(pgid), 30, "SGLang's processes to end with the launcher")
    assert not Path(prom_dir).exists()


def test_sglang_failure_is_the_launcher_exit_status(tmp_path: Path) -> None:
    proc = serve(
        [
            "--role",
            "prefill",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--bootstrap-port",
            str(free_port()),
            "--metrics-port",
            str(free_port()),
        ],
        ["--model-path", str(tmp_path / "no-such-model"), "--load-format", "dummy", "--device", "cpu"],
    )
    try:
        out, _ = proc.communicate(timeout=START_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode not in (0, None), out
    assert "pdwarden: SGLang exited with status" in out


def test_conflicting_arguments_stop_before_sglang_starts() -> None:
    port = free_port()
    done = subprocess.run(
        [
            *PDW,
            "runtime",
            "serve",
            "--engine",
            "sglang",
            "--role",
            "prefill",
            "--port",
            str(port),
            "--metrics-port",
            str(free_port()),
            "--",
            "--model-path",
            "/m",
            "--port",
            "31000",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode != 0
    assert f"--port 31000 (pdwarden sets --port {port})" in done.stdout + done.stderr
    assert "sglang.launch_server" not in done.stdout + done.stderr
