"""Why a model's pods are not running, in the words of whoever stopped them (pure).

- The scheduler: a pod it cannot place (an untolerated taint, no node matching the
  nodeSelector, too few GPUs) stays Pending with PodScheduled=False, reason Unschedulable and
  a message such as "0/3 nodes are available: 3 node(s) had untolerated taint(s)".
- Admission: a pod the API server refuses (Pod Security, a quota) is never created; the
  ReplicaSet's failure reaches the Deployment as condition ReplicaFailure.

Neither shows in a Deployment's replica counts; status says so, per role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator.status import Workload

# Look at pods only once a role has been waiting this long: a new model's pods are Pending
# for a moment anyway, and an idle or settled model costs no pod listing.
LOOK_AFTER_S = 20.0
MAX_MESSAGE = 500


def unschedulable(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Role -> the scheduler's message for one of its Pending, unschedulable pods."""
    out: dict[str, str] = {}
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        meta = pod.get("metadata") or {}
        role = str((meta.get("labels") or {}).get(contract.LABEL_ROLE, ""))
        if not role or role in out or (pod.get("status") or {}).get("phase") != "Pending":
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                message = str(c.get("message") or "Unschedulable")[:MAX_MESSAGE]
                out[role] = f"the scheduler cannot place pod {meta.get('name')}: {message}"
    return out


def refused(deployments: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Role -> why the API server refused to create its pods (Deployment ReplicaFailure)."""
    out: dict[str, str] = {}
    for obj in deployments:
        role = str(((obj.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE, ""))
        for c in (obj.get("status") or {}).get("conditions") or []:
            if role and c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                out[role] = f"pods are refused: {str(c.get('message') or c.get('reason'))[:MAX_MESSAGE]}"
    return out


def pods_not_ready(workloads: Iterable[Workload]) -> bool:
    """Whether a workload has pods that are not ready. Without any (none made yet, or the
    controller has not caught up with a new workload: minutes for a thousand new models on a
    small cluster) the scheduler has nothing to say, and listing pods would only load the API
    server."""
    return any(w.replicas > w.ready for w in workloads)
