"""What the demo shows a user: one line per step while it runs, and the tables at the end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console
from rich.table import Table

from pdwarden_demo.demo_scenario import DemoResult, Observed


class Steps:
    """Progress output: one line per step, a spinner while waiting."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def say(self, msg: str) -> None:
        self.console.log(f"[bold]{msg}")

    def ok(self, msg: str) -> None:
        self.console.log(f"[green]✓[/green] {msg}")

    @contextlib.contextmanager
    def waiting(self, msg: str) -> Iterator[None]:
        with self.console.status(msg):
            yield


def summary_table(result: DemoResult, seen: Observed) -> list[Table]:
    tables = []
    t = Table(title="pdwarden demo: what happened")
    t.add_column("step")
    t.add_column("result")
    injected = (
        f"{result.wedges_injected} ({seen.fault} into {result.wedged_pod})" if result.wedged_pod else "no"
    )
    t.add_row("wedge injected", injected)
    det = f"{result.detection_seconds:.1f}s after the fault" if result.detection_seconds is not None else "no"
    t.add_row("wedge detected", det)
    t.add_row("remediations", f"{result.remediations} (replacement: {result.replacement_pod or '-'})")
    for phase, ok, failed, cancelled in seen.traffic_phases:
        t.add_row(f"traffic {phase}", f"{ok} ok, {failed} failed, {cancelled} cancelled by clients")
    t.add_row("traffic recovered", "yes" if result.recovered else "NO")
    p99 = result.wedged_requests_p99_s
    caught = f"{result.wedged_requests}" + (f", p99 {p99:.1f}s" if p99 is not None else "")
    t.add_row("requests caught in the wedge (answered by another pair)", caught)
    t.add_row("alerts in Alertmanager", ", ".join(result.alerts_fired) or "none")
    before = result.alerts_before_fault
    t.add_row("alerts before the fault", "-" if before is None else ", ".join(before) or "none")
    tables.append(t)
    if seen.remediation_entries:
        r = Table(title="status.remediations")
        for col in ("pod", "role", "reason", "action", "time", "outcome"):
            r.add_column(col)
        for entry in seen.remediation_entries:
            r.add_row(
                *(str(entry.get(c, "")) for c in ("pod", "role", "reason", "action", "time", "outcome"))
            )
        tables.append(r)
    if seen.events:
        e = Table(title="Events")
        for col in ("type", "reason", "object", "message"):
            e.add_column(col)
        for ev in seen.events[-15:]:
            inv = ev.get("involvedObject") or {}
            e.add_row(
                ev.get("type", ""),
                ev.get("reason", ""),
                f"{inv.get('kind')}/{inv.get('name')}",
                (ev.get("message") or "")[:120],
            )
        tables.append(e)
    return tables
