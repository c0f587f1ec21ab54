"""The status the fleet's node writes for a pod it runs (pure): Running and Ready at once,
every container started, the pod's own address."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]
NODE_IP = "127.0.0.1"


def running(pod: Mapping[str, Any], ip: str, now: str) -> JSON:
    spec = pod.get("spec") or {}
    uid = (pod.get("metadata") or {}).get("uid", "")

    def container(c: Mapping[str, Any], state: JSON, ready: bool) -> JSON:
        return {
            "name": c.get("name"),
            "image": c.get("image", ""),
            "imageID": c.get("image", ""),
            "containerID": f"fleet://{uid}/{c.get('name')}",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": state,
        }

    def condition(kind: str) -> JSON:
        return {"type": kind, "status": "True", "lastTransitionTime": now}

    done = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}
    status: JSON = {
        "phase": "Running",
        "hostIP": NODE_IP,
        "hostIPs": [{"ip": NODE_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "conditions": [
            condition(kind)
            for kind in (
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
                "PodScheduled",
            )
        ],
        "containerStatuses": [
            container(c, {"running": {"startedAt": now}}, True) for c in spec.get("containers") or []
        ],
    }
    if spec.get("initContainers"):
        status["initContainerStatuses"] = [container(c, done, False) for c in spec["initContainers"]]
    return status
