"""The demo's scenario, pure: the model it deploys, the chart values and alert windows it uses,
what it must observe (`DemoResult.failures`), and how it reads the model's status and Events.
`pdwarden_demo.demo` runs it; `pdwarden_demo.demo_report` shows it; tests assert on it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime

import pdwarden_contract as contract
from pdwarden_demo import chart, demo_traffic
from pdwarden_demo.demo_kube import Obj
from pdwarden_localcluster.monitoring import Alert

NAMESPACE = "pdwarden-demo"
RELEASE = "pdwarden"
EXAMPLE = chart.REPO_ROOT / "examples" / "synthetic.yaml"
ALERT_POLL_S = 1.0  # how often the demo asks Alertmanager what it holds
WARMUP_S = 20.0
RECOVERY_SETTLE_S = 5.0
RECOVERY_WINDOW_S = 20.0
TRAFFIC = demo_traffic.TrafficConfig()
PREFILL_DEMO_ARGS = ("--hardening", "emulated-port", "--race-window", "5")
INFLIGHT_DEADLINE_S = 15  # the demo model's transfer.inflightDeadlineSeconds
# A healthy answer takes well under a second: a request slower than this was caught in the wedge.
WEDGED_AFTER_S = 2.0
# The promise: a request caught in the wedge is answered, by another pair, within the runtime's
# deadline and this much more.
WEDGED_SLACK_S = 2.0
# Alerts about the wedged pod's queue; either shows the wedge (a queue that still finishes
# its short requests keeps its progress counter moving, so only the age may fire).
INFLIGHT_ALERTS = ("PdwardenInflightStuck", "PdwardenInflightOldestAgeHigh")
# Cancelling clients make the hardened decode pods refuse late status writes (the race,
# caught: what the runtime's fix is for), so that informational alert may fire any time.
ALLOWED_BEFORE_FAULT = ("PdwardenStatusWritesRefused",)

# Where the demo's operator watches: "cluster" is the chart's default (every namespace);
# "namespace" watches only the demo's own, so that on a cluster that was already up the demo
# never acts on models it did not create. "auto": cluster scope only on a cluster the demo
# started itself.
SCOPES = ("auto", "cluster", "namespace")


def operator_scope(asked: str, started_cluster: bool) -> str:
    """The chart's operator.scope for the demo's choice ``asked`` (one of SCOPES)."""
    if asked not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, not {asked!r}")
    if asked == "auto":
        return "cluster" if started_cluster else "namespace"
    return asked


def chart_values(scope: str) -> dict[str, str]:
    """The demo's helm values for the operator's ``scope`` ("cluster" or "namespace"): the
    chart's monitors and alert rules on (the local cluster's Prometheus picks them up, and
    the operator's NetworkPolicy admits it by default), and the demo's own pod may take the
    fault it injects."""
    allow = {"podPolicy.namespaces." + NAMESPACE: "{faultInjection}", **DEMO_MONITORING_VALUES}
    if scope == "namespace":
        return {"operator.scope": "namespace", "operator.watchNamespace": NAMESPACE, **allow}
    return {"operator.scope": "cluster", **allow}


# The chart's monitors and alert rules, with windows sized for a demo that lasts minutes,
# not hours, and scrapes frequent enough to see a wedge that lives for seconds.
DEMO_MONITORING_VALUES = {
    "monitoring.podMonitor.enabled": "true",
    "monitoring.podMonitor.interval": "2s",
    "monitoring.podMonitor.scrapeTimeout": "2s",
    "monitoring.serviceMonitor.enabled": "true",
    "monitoring.serviceMonitor.interval": "2s",
    "monitoring.serviceMonitor.scrapeTimeout": "2s",
    "monitoring.prometheusRule.enabled": "true",
    "monitoring.prometheusRule.rules.inflightStuck.window": "20s",
    "monitoring.prometheusRule.rules.inflightStuck.for": "0s",
    "monitoring.prometheusRule.rules.inflightOldestAge.thresholdSeconds": "15",
    "monitoring.prometheusRule.rules.inflightOldestAge.for": "0s",
    "monitoring.prometheusRule.rules.wedgeRemediated.window": "30s",
    "monitoring.prometheusRule.rules.statusWritesRefused.window": "1m",
    "monitoring.prometheusRule.rules.podsUnobserved.for": "3m",
    "monitoring.prometheusRule.rules.operatorDown.for": "1m",
}


def demo_manifest(example: Obj, namespace: str = NAMESPACE) -> Obj:
    """The example model, shaped for the demo: 2+2+1 pods, fault injection allowed, a quick watchdog."""
    m = copy.deepcopy(example)
    meta = m.setdefault("metadata", {})
    meta["namespace"] = namespace
    meta.setdefault("annotations", {})[contract.ANNOTATION_ALLOW_FAULT_INJECTION] = "true"
    spec = m["spec"]
    # The runtime's in-pod fixes (terminal-sticky status, no silent skip, deadlines) would
    # catch the race inside the pod; the demo turns them off on prefill so the race wedges
    # it, and shows the operator, the last layer. The race window is the fault's: how long a
    # finished chunk's status write waits for an ABORT.
    spec["prefill"] = {
        **spec.get("prefill", {}),
        "replicas": 2,
        "args": [*PREFILL_DEMO_ARGS],
    }
    spec["decode"] = {**spec.get("decode", {}), "replicas": 2}
    spec["router"] = {**spec.get("router", {}), "replicas": 1}
    # The prefill runs the emulated port (no self-heal), so the injected wedge stays for the
    # operator to find; the deadlines stay below stuckAfterSeconds, as the ladder's order requires.
    spec["transfer"] = {
        **spec.get("transfer", {}),
        "inflightDeadlineSeconds": INFLIGHT_DEADLINE_S,
        "transferDeadlineSeconds": 10,
    }
    # The demo injects its fault into a prefill pod from the host, outside the cluster, which
    # the model's NetworkPolicy refuses (only the router may reach a worker's HTTP port). The
    # worker key stays on: the demo presents it, read from the model's Secret as an admin.
    spec["networkPolicy"] = {"enabled": False}
    spec["watchdog"] = {
        **spec.get("watchdog", {}),
        "stuckAfterSeconds": 20,
        "scrapeIntervalSeconds": 5,
        "action": "restart",
        "maxRemediations": 3,
        "budgetWindowSeconds": 600,
        "maxUnavailable": 1,
    }
    return m


@dataclass
class DemoResult:
    wedges_injected: int = 0
    wedges_detected: int = 0
    detection_seconds: float | None = None
    remediations: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    recovered: bool = False
    requests_cancelled: int = 0
    wedged_requests: int = 0  # answered after the fault, slower than WEDGED_AFTER_S
    wedged_requests_p99_s: float | None = None  # their p99 (None: no request was caught)
    alerts_fired: list[str] = field(default_factory=list)
    alerts_for_wedged_pod: list[str] = field(default_factory=list)
    alerts_before_fault: list[str] | None = None  # None: not evaluated
    wedged_pod: str | None = None
    replacement_pod: str | None = None
    operator_scope: str | None = None
    error: str | None = None

    def failures(self) -> list[str]:
        """What did not happen (empty: the demo showed everything it promises)."""
        if self.error:
            return [self.error]  # what did not happen after it is a consequence
        out = []
        if self.wedges_injected < 1:
            out.append("no wedge was injected")
        if self.wedges_detected < self.wedges_injected:
            out.append("the operator did not detect the wedge")
        if self.remediations < 1:
            out.append("the wedged pod was not remediated")
        if not self.recovered:
            out.append("traffic did not recover")
        if self.requests_failed:
            out.append(f"{self.requests_failed} request(s) failed: a client saw the wedge")
        bound = INFLIGHT_DEADLINE_S + WEDGED_SLACK_S
        if self.wedged_requests_p99_s is not None and self.wedged_requests_p99_s > bound:
            out.append(
                f"requests caught in the wedge took {self.wedged_requests_p99_s:.1f}s (p99), more than "
                f"the inflight deadline plus {WEDGED_SLACK_S:g}s ({bound:g}s)"
            )
        if not set(INFLIGHT_ALERTS) & set(self.alerts_for_wedged_pod):
            out.append(f"no inflight alert ({' or '.join(INFLIGHT_ALERTS)}) fired for the wedged pod")
        if "PdwardenWedgeRemediated" not in self.alerts_fired:
            out.append("the PdwardenWedgeRemediated alert did not fire")
        early = [a for a in self.alerts_before_fault or [] if a not in ALLOWED_BEFORE_FAULT]
        if early:
            out.append(f"alerts fired before the fault was injected: {', '.join(early)}")
        return out

    def json_line(self) -> str:
        keys = (
            "wedges_injected",
            "wedges_detected",
            "detection_seconds",
            "remediations",
            "requests_ok",
            "requests_failed",
            "recovered",
            "requests_cancelled",
            "wedged_requests",
            "wedged_requests_p99_s",
            "alerts_fired",
            "alerts_for_wedged_pod",
            "alerts_before_fault",
            "operator_scope",
        )
        data = asdict(self)
        out = {k: data[k] for k in keys}
        for key in ("detection_seconds", "wedged_requests_p99_s"):
            if out[key] is not None:
                out[key] = round(out[key], 1)
        return json.dumps(out)


@dataclass
class Observed:
    """What the demo saw of the cluster, for the summary."""

    events: list[Obj] = field(default_factory=list)
    remediation_entries: list[Obj] = field(default_factory=list)
    conditions: list[Obj] = field(default_factory=list)
    traffic_phases: list[tuple[str, int, int, int]] = field(default_factory=list)
    inject_time: float | None = None  # wall clock of the fault injection
    fault: str | None = None  # the fault injected


@dataclass
class AlertsSeen:
    """Every alert Alertmanager held at some poll of the demo (an alert that resolved is gone
    from its API by the next poll, so the demo keeps what it saw)."""

    by_fingerprint: dict[str, Alert] = field(default_factory=dict)

    def add(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self.by_fingerprint.setdefault(alert.fingerprint, alert)

    def names(self, *, pod: str | None = None, only: tuple[str, ...] | None = None) -> list[str]:
        """Alert names seen (for `pod`, of `only` these), sorted."""
        return sorted(
            {
                a.name
                for a in self.by_fingerprint.values()
                if (pod is None or a.labels.get("pod") == pod) and (only is None or a.name in only)
            }
        )

    def started_before(self, wall: float) -> list[str]:
        return sorted(
            {
                a.name
                for a in self.by_fingerprint.values()
                if datetime.fromisoformat(a.starts_at).timestamp() < wall
            }
        )


def remediations_for(dm: Obj, pod: str) -> list[Obj]:
    return [r for r in (dm.get("status") or {}).get("remediations") or [] if r.get("pod") == pod]


def wedge_seen(dm: Obj, pod: str) -> bool:
    watchdog = (dm.get("status") or {}).get("watchdog") or {}
    return pod in (watchdog.get("wedgedPods") or []) or bool(remediations_for(dm, pod))


def event_relevant(event: Obj, model: str, result: DemoResult) -> bool:
    """Events on the model, or on the wedged pod (a restart or eviction is posted there too)."""
    involved = event.get("involvedObject") or {}
    on_model = involved.get("kind") == contract.KIND and involved.get("name") == model
    on_wedged_pod = involved.get("kind") == "Pod" and involved.get("name") == result.wedged_pod
    return on_model or on_wedged_pod


def recovered(ok: int, failed: int) -> bool:
    """Traffic after the restart: enough answers, nearly all of them good."""
    return ok >= 5 and ok >= 0.9 * (ok + failed)
