"""Why a model's pods are not running yet, from the scheduler's own words (pure).

A pod the scheduler cannot place (an untolerated taint, no node matching the nodeSelector,
too few GPUs) stays Pending with condition PodScheduled=False, reason Unschedulable and a
message such as "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: }".
The Deployment's own status never says so; status does, per role.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pdwarden_runtime import contract

# Look at pods only once a role has been waiting this long: a new model's pods are Pending
# for a moment anyway, and an idle or settled model costs no pod listing.
LOOK_AFTER_S = 20.0


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
                out[role] = f"pod {meta.get('name')}: {str(c.get('message') or 'Unschedulable')[:500]}"
    return out
