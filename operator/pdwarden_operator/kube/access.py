"""What an extension API server asks of the cluster: who the front proxy is, and may a user act.

The API server's aggregation layer forwards a request to the external metrics API with its
front-proxy client certificate and the caller in headers; the cluster publishes how to check
that (the ConfigMap below), and a SubjectAccessReview says whether the caller may.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube.client import KubeClient

AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")


@dataclass(frozen=True)
class FrontProxy:
    """How the API server's front proxy identifies itself and the caller (requestheader-*)."""

    client_ca: str  # PEM
    allowed_names: tuple[str, ...]  # CNs of the front proxy's cert; empty: any the CA signed
    username_headers: tuple[str, ...]
    group_headers: tuple[str, ...]
    extra_headers_prefixes: tuple[str, ...]


def front_proxy_of(data: Mapping[str, str]) -> FrontProxy | None:
    """The ConfigMap's data parsed; None when the cluster has no aggregation layer configured."""
    ca = data.get("requestheader-client-ca-file") or ""
    if "BEGIN CERTIFICATE" not in ca:
        return None

    def names(key: str) -> tuple[str, ...]:
        try:
            value = json.loads(data.get(key) or "[]")
        except ValueError:
            return ()
        return tuple(str(v) for v in value) if isinstance(value, list) else ()

    return FrontProxy(
        client_ca=ca,
        allowed_names=names("requestheader-allowed-names"),
        username_headers=names("requestheader-username-headers"),
        group_headers=names("requestheader-group-headers"),
        extra_headers_prefixes=names("requestheader-extra-headers-prefix"),
    )


async def read_front_proxy(client: KubeClient) -> FrontProxy | None:
    obj = await kube_apply.get(client, "v1", "ConfigMap", *AUTH_CONFIGMAP)
    return None if obj is None else front_proxy_of(obj.get("data") or {})


async def may(
    client: KubeClient,
    user: str,
    groups: Sequence[str],
    extra: Mapping[str, Sequence[str]],
    resource: Mapping[str, str],
) -> tuple[bool, str]:
    """A SubjectAccessReview of `resource` (its resourceAttributes) for that user: (allowed, reason)."""
    body: dict[str, Any] = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": list(groups),
            "extra": {k: list(v) for k, v in extra.items()},
            "resourceAttributes": dict(resource),
        },
    }
    review = await client.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=body)
    status = review.get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or status.get("evaluationError") or "")
