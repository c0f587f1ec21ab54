"""Post Kubernetes Events (core/v1) about a DisaggregatedModel or a pod. Never raises."""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
from typing import Any, Literal

import pdwarden_contract as contract
from pdwarden_operator.kube.client import KubeApiError, KubeClient, resource_path
from pdwarden_operator.timestamps import format_time

log = logging.getLogger("pdwarden.events")

COMPONENT = "pdwarden-watchdog"
MAX_MESSAGE = 1024  # the API server rejects longer event messages


def involved(api_version: str, kind: str, namespace: str, name: str, uid: str = "") -> dict[str, str]:
    ref = {"apiVersion": api_version, "kind": kind, "namespace": namespace, "name": name}
    if uid:
        ref["uid"] = uid
    return ref


def event_body(
    obj: dict[str, str], reason: str, message: str, event_type: Literal["Normal", "Warning"], now: dt.datetime
) -> dict[str, Any]:
    stamp = format_time(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{obj['name']}.", "namespace": obj["namespace"]},
        "involvedObject": obj,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": event_type,
        "source": {"component": COMPONENT},
        "reportingComponent": f"{contract.API_GROUP}/{COMPONENT}",
        "reportingInstance": os.environ.get(contract.ENV_POD_NAME) or socket.gethostname(),
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_event(
    client: KubeClient,
    obj: dict[str, str],
    reason: str,
    message: str,
    event_type: Literal["Normal", "Warning"] = "Warning",
) -> bool:
    """Post one Event; False (and a log line) when the API refused it: events are best effort."""
    body = event_body(obj, reason, message, event_type, dt.datetime.now(dt.UTC))
    try:
        await client.request("POST", resource_path("v1", "Event", obj["namespace"]), body=body)
    except KubeApiError as exc:
        log.warning("event %s on %s/%s not posted: %s", reason, obj["kind"], obj["name"], exc)
        return False
    return True
