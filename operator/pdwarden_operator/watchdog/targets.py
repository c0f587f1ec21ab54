"""Pod objects -> what the ladder sees (PodView) and where to scrape them. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.timestamps import from_rfc3339
from pdwarden_operator.watchdog.verdict import PodView


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


def pod_addresses(pod: Mapping[str, Any]) -> set[str]:
    """The pod's IPs (`status.podIP` and, dual-stack, `status.podIPs`)."""
    status = pod.get("status") or {}
    found = {str(status["podIP"])} if status.get("podIP") else set()
    for entry in status.get("podIPs") or []:
        if isinstance(entry, Mapping) and entry.get("ip"):
            found.add(str(entry["ip"]))
    return found


def peer_addresses(pods: Iterable[Mapping[str, Any]], gone_ips: Iterable[str] = ()) -> frozenset[str]:
    """What a `peer` label of the model's pods may name: the IPs of its listed pods and of its
    runtime pods gone lately (a runtime keeps a gone peer's series until it forgets it)."""
    found: set[str] = {ip for ip in gone_ips if ip}
    for pod in pods:
        found |= pod_addresses(pod)
    return frozenset(found)
