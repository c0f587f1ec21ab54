"""Pure computation of a pod's status from its container runs (what the kubelet reports)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pdwarden_localcluster.kubelet.container import ContainerRun

JSON = dict[str, Any]


def container_status(run: ContainerRun, image: str) -> JSON:
    state: JSON
    if run.terminated is not None and not run.waiting_reason:
        state = {"terminated": dict(run.terminated)}
    elif run.running():
        state = {"running": {"startedAt": run.started_wall}}
    else:
        waiting: JSON = {"reason": run.waiting_reason or "ContainerCreating"}
        if run.waiting_message:
            waiting["message"] = run.waiting_message
        state = {"waiting": waiting}
    # while waiting to restart, the run that just ended is the "last" one
    last = run.terminated if "waiting" in state and run.terminated is not None else run.last_terminated
    status: JSON = {
        "name": run.name,
        "image": image,
        "imageID": "",
        "ready": run.ready,
        "started": run.running() and run.started,
        "restartCount": run.restart_count,
        "state": state,
        "lastState": {"terminated": dict(last)} if last else {},
    }
    if run.proc is not None:
        status["containerID"] = f"pdwarden://{run.proc.pid}"
    return status


def will_restart(run: ContainerRun, restart_policy: str) -> bool:
    if run.terminated is None:
        return False
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return int(run.terminated.get("exitCode", 1)) != 0
    return False


def phase(runs: Sequence[ContainerRun], restart_policy: str, initialized: bool) -> str:
    if not runs:
        return "Pending"
    if not initialized:
        return "Pending"
    if any(r.attempts == 0 for r in runs):
        return "Pending"
    if any(r.running() for r in runs):
        return "Running"
    if any(will_restart(r, restart_policy) for r in runs):
        return "Running"
    if all(r.terminated is not None and int(r.terminated.get("exitCode", 1)) == 0 for r in runs):
        return "Succeeded"
    return "Failed"


def conditions(previous: Sequence[JSON], wanted: dict[str, bool], timestamp: str) -> list[JSON]:
    """Conditions with lastTransitionTime kept unless the status flips; others (PodScheduled) kept."""
    prev = {c.get("type"): c for c in previous}
    out: list[JSON] = [c for c in previous if c.get("type") not in wanted]
    for ctype, ok in wanted.items():
        status = "True" if ok else "False"
        old = prev.get(ctype)
        if old is not None and old.get("status") == status:
            out.append(old)
        else:
            out.append(
                {"type": ctype, "status": status, "lastProbeTime": None, "lastTransitionTime": timestamp}
            )
    return out


def pod_status(
    pod: JSON,
    init_runs: Sequence[ContainerRun],
    runs: Sequence[ContainerRun],
    pod_ip: str,
    host_ip: str,
    start_time: str,
    sandbox_ready: bool,
    initialized: bool,
    timestamp: str,
) -> JSON:
    spec = pod.get("spec", {})
    images = {
        c["name"]: c.get("image", "")
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
    }
    restart_policy = spec.get("restartPolicy", "Always")
    containers_ready = bool(runs) and all(r.ready for r in runs)
    the_phase = phase(runs, restart_policy, initialized)
    if the_phase in ("Succeeded", "Failed"):
        containers_ready = False
    wanted = {
        "PodReadyToStartContainers": sandbox_ready,
        "Initialized": initialized,
        "ContainersReady": containers_ready,
        "Ready": containers_ready,
    }
    status: JSON = {
        "phase": the_phase,
        "conditions": conditions((pod.get("status") or {}).get("conditions") or [], wanted, timestamp),
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": start_time,
        "containerStatuses": [container_status(r, images.get(r.name, "")) for r in runs],
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if init_runs:
        status["initContainerStatuses"] = [container_status(r, images.get(r.name, "")) for r in init_runs]
    return status
