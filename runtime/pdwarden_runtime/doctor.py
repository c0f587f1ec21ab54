"""`pdwarden runtime doctor --engine sglang [--json]`: is the hardening active where it
matters?

In a fresh process tree started exactly like a hardened SGLang pod's (the launcher's
environment; the ``spawn`` start method and ``multiprocessing.Process`` SGLang uses for its
scheduler), it reports the installed sglang and nixl versions, whether pdwarden supports
them, and whether each hardening fix (``hardening.config.Fix``) is active in the main
process and in the spawned scheduler-like child; in that child it exercises the hardening on
SGLang's real classes (``sglang_boot.behaviour``: a refused write to a Failed room, a
stalled handle that fails its room without acking decode's pages, the overridden methods'
signatures against the pinned upstream ones) and reports the pod's own configuration (the
launcher's PDWARDEN_HARDENING_CONFIG and related environment). Exit status 0 only if
everything is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, Final

import click

from pdwarden_runtime.hardening.config import Fix

FIXES: Final = tuple(fix.value for fix in Fix)
PROCESSES: Final = ("main", "scheduler")
PROBE_MODULE: Final = "pdwarden_runtime.sglang_boot.probe"
DEFAULT_TIMEOUT_SECONDS: Final = 240.0


def run_probe(env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    """Run the probe tree in a fresh interpreter with ``env``; its JSON, or an error record."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", PROBE_MODULE],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"probe_error": f"the probe did not finish within {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {
            "probe_error": f"the probe exited with status {done.returncode}",
            "stderr_tail": done.stderr[-4000:],
        }
    tree: dict[str, Any] = json.loads(lines[-1])
    return tree


def probe_env(base_env: Mapping[str, str], prom_dir: str) -> dict[str, str]:
    """The launcher's environment for SGLang, but recording activation errors for the report.

    In a pod the launcher's PDWARDEN_HARDENING_CONFIG (the pod's own flags) is used as is;
    without one the defaults are checked, and the report says so."""
    from pdwarden_runtime.sglang_boot import ENV_HARDENING_CONFIG, seam_env

    config: dict[str, Any] = {"engine": "sglang"}
    raw = base_env.get(ENV_HARDENING_CONFIG)
    if raw:
        try:
            config = {**config, **json.loads(raw)}
        except (ValueError, TypeError):
            config = {**config, "_unparseable": raw}
    return seam_env(base_env, config, prom_dir=prom_dir, on_error="record")


def verdict(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The doctor's report from the probe tree's JSON. Pure."""
    problems: list[str] = []
    if "probe_error" in tree:
        problems.append(str(tree["probe_error"]))
    procs: dict[str, Mapping[str, Any]] = {p: tree.get(p) or {} for p in PROCESSES}
    scheduler = procs["scheduler"]
    reference = scheduler if "versions" in scheduler else procs["main"]
    versions = reference.get("versions") or {}
    supported = reference.get("supported") or {}
    for dist in ("sglang", "nixl"):
        if versions.get(dist) is None:
            problems.append(f"{dist} is not installed")
        elif dist not in supported:
            problems.append(
                f"cannot tell whether {dist} {versions[dist]} is supported "
                "(pdwarden_runtime.hardening did not load)"
            )
        elif not supported.get(dist, False):
            problems.append(f"{dist} {versions[dist]} is not a version pdwarden supports")
    if tree.get("start_method") not in (None, "spawn"):
        problems.append(f"the probe used start method {tree.get('start_method')!r}, not spawn")
    for name, proc in procs.items():
        if "probe_error" in tree:
            break
        for key in ("report_error", "hardening_error", "kv_class_error"):
            if key in proc:
                problems.append(f"{name} process: {proc[key]}")
        seam = proc.get("seam") or {}
        if not seam.get("activated"):
            problems.append(
                f"{name} process: hardening not activated when SGLang's NIXL backend loaded"
                + (f" ({seam['error']})" if seam.get("error") else "")
            )
        if proc.get("kv_classes_hardened") is False:
            problems.append(f"{name} process: get_kv_class(NIXL) still returns SGLang's own classes")
        fixes = proc.get("fixes") or {}
        inactive = [f for f in FIXES if not fixes.get(f)]
        if inactive:
            problems.append(f"{name} process: fixes not active: {', '.join(inactive)}")
    if scheduler and not scheduler.get("prometheus_multiprocess", False) and "probe_error" not in tree:
        problems.append(
            "scheduler process: prometheus_client is not in multiprocess mode, "
            "contract metrics cannot reach the metrics port"
        )
    behaviour = scheduler.get("behaviour") or {}
    if "behaviour_error" in scheduler:
        problems.append(f"scheduler process: behaviour checks: {scheduler['behaviour_error']}")
    elif scheduler.get("kv_classes_hardened") and "probe_error" not in tree:
        if not behaviour:
            problems.append("scheduler process: behaviour checks did not run")
        for check, outcome in sorted(behaviour.items()):
            if not outcome.get("ok"):
                problems += [f"behaviour {check}: {p}" for p in outcome.get("problems") or ["failed"]]
    fixes_in_scheduler = scheduler.get("fixes") or {}
    return {
        "configuration": scheduler.get("configuration"),
        "behaviour": {check: bool(outcome.get("ok")) for check, outcome in behaviour.items()},
        "engine": "sglang",
        "ok": not problems,
        "sglang": {"version": versions.get("sglang"), "supported": bool(supported.get("sglang"))},
        "nixl": {"version": versions.get("nixl"), "supported": bool(supported.get("nixl"))},
        "seam": (scheduler.get("seam") or {}).get("seam"),
        "start_method": tree.get("start_method"),
        "fixes": {f: bool(fixes_in_scheduler.get(f)) for f in FIXES},
        "processes": {p: dict(procs[p]) for p in PROCESSES},
        "problems": problems,
    }


def diagnose(
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run the probe the way the launcher runs SGLang and judge it."""
    prom_dir = tempfile.mkdtemp(prefix="pdwarden-doctor-prom-")
    try:
        tree = run_probe(probe_env(os.environ if base_env is None else base_env, prom_dir), timeout)
    finally:
        shutil.rmtree(prom_dir, ignore_errors=True)
    return verdict(tree)


def render_text(report: Mapping[str, Any]) -> str:
    mark = {True: "ok ", False: "NO "}
    lines = [
        f"{mark[report['sglang']['supported']]} sglang {report['sglang']['version']}",
        f"{mark[report['nixl']['supported']]} nixl {report['nixl']['version']}",
        f"    seam: {report['seam']}, start method: {report['start_method']}",
    ]
    lines += [
        f"{mark[active]} fix {name} (in the spawned scheduler process)"
        for name, active in report["fixes"].items()
    ]
    lines += [f"{mark[ok]} behaviour {check}" for check, ok in (report.get("behaviour") or {}).items()]
    config = report.get("configuration") or {}
    if config:
        lines.append(
            f"    configuration: fixes {','.join(config.get('fixes', []))}, "
            f"transfer deadline {config.get('transfer_deadline')}s, "
            f"inflight deadline {config.get('inflight_deadline')}, fault {config.get('fault')}, "
            f"stock classes {config.get('stock_classes')}"
        )
    lines += [f"problem: {p}" for p in report["problems"]]
    lines.append("hardening ACTIVE" if report["ok"] else "hardening NOT active")
    return "\n".join(lines)


@click.command("doctor")
@click.option(
    "--engine",
    type=click.Choice(["sglang"]),
    default="sglang",
    show_default=True,
    help="The engine whose hardening to check.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=DEFAULT_TIMEOUT_SECONDS,
    show_default=True,
    help="Seconds the probe may take.",
)
def doctor(engine: str, as_json: bool, timeout: float) -> None:
    """Check, in fresh processes started the way SGLang starts them, that the NIXL
    hardening is active; exit 0 only if every fix is."""
    report = diagnose(timeout)
    click.echo(json.dumps(report, sort_keys=True) if as_json else render_text(report))
    sys.exit(0 if report["ok"] else 1)
