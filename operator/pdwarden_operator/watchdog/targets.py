"""Pod objects -> what the ladder sees (PodView) and where to scrape them. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdwarden_operator.watchdog.ladder import PodView
from pdwarden_operator.watchdog.state import from_rfc3339
from pdwarden_runtime import contract


def pod_view(pod: Mapping[str, Any]) -> PodView | None:
    """None for an object that is not a usable runtime pod (no uid or no runtime role). A
    quarantined pod is seen with the role it served."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    role = labels.get(contract.LABEL_ROLE)
    quarantined = role == contract.ROLE_QUARANTINED
    if quarantined:
        role = labels.get(contract.LABEL_QUARANTINED_ROLE)
    if not meta.get("uid") or not meta.get("name") or role not in contract.RUNTIME_ROLES:
        return None
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodView(
        name=str(meta["name"]),
        uid=str(meta["uid"]),
        role=str(role),
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        ip=str((pod.get("status") or {}).get("podIP") or ""),
        quarantined=quarantined,
        quarantined_at=(
            from_rfc3339((meta.get("annotations") or {}).get(contract.ANNOTATION_QUARANTINED_AT))
            if quarantined
            else None
        ),
    )


def metrics_url(pod: Mapping[str, Any]) -> str | None:
    """http://<pod IP>:<port named metrics>/metrics for a running pod; None when not scrapable yet."""
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if status.get("phase") != "Running" or not ip or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    port = contract.DEFAULT_METRICS_PORT
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == contract.PORT_NAME_METRICS and isinstance(p.get("containerPort"), int):
                port = p["containerPort"]
    host = f"[{ip}]" if ":" in str(ip) else ip
    return f"http://{host}:{port}{contract.METRICS_PATH}"
