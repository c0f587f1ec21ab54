"""One Kubernetes API connection for the operator, used from asyncio.

kopf has no general-purpose client, so requests go through the `kubernetes` package's
synchronous REST layer (connection pooling, kubeconfig and in-cluster auth) on a small
thread pool. Responses are parsed as plain JSON dicts: no generated model classes.
"""

from __future__ import annotations

import asyncio
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

import pdwarden_contract as contract

Obj = dict[str, Any]
REQUEST_TIMEOUT_S = 30
DEFAULT_WORKERS = 16
# Statuses worth retrying: conflicts, throttling, server trouble, and 0 = no response at all.
RETRIABLE = frozenset({0, 409, 429, 500, 502, 503, 504})


class KubeApiError(Exception):
    """An API request failed; `status` is the HTTP status (0: no response)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        method: str = "",
        path: str = "",
        causes: tuple[str, ...] = (),
        retry_after: float | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        self.causes = causes  # the Status body's details.causes[].type (or .reason)
        self.retry_after = retry_after  # seconds: Retry-After, else details.retryAfterSeconds
        super().__init__(f"{method} {path}: {status} {reason}: {message}")

    @property
    def retriable(self) -> bool:
        if self.status == 500 and "failed to create typed patch object" in self.message:
            return False  # server-side apply's answer to a field the schema lacks: a bad request
        return self.status in RETRIABLE

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True)
class ResourceType:
    plural: str
    namespaced: bool = True


# (apiVersion, kind) -> where it lives. Only the kinds the operator touches.
RESOURCE_TYPES: dict[tuple[str, str], ResourceType] = {
    ("apps/v1", "Deployment"): ResourceType("deployments"),
    ("apps/v1", "StatefulSet"): ResourceType("statefulsets"),
    ("apps/v1", "ReplicaSet"): ResourceType("replicasets"),
    ("v1", "Service"): ResourceType("services"),
    ("v1", "ServiceAccount"): ResourceType("serviceaccounts"),
    ("v1", "Pod"): ResourceType("pods"),
    ("v1", "ConfigMap"): ResourceType("configmaps"),
    ("v1", "Secret"): ResourceType("secrets"),  # created, never read (the worker key)
    ("v1", "Event"): ResourceType("events"),
    ("v1", "Namespace"): ResourceType("namespaces", namespaced=False),
    ("events.k8s.io/v1", "Event"): ResourceType("events"),
    ("rbac.authorization.k8s.io/v1", "Role"): ResourceType("roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ResourceType("rolebindings"),
    ("policy/v1", "PodDisruptionBudget"): ResourceType("poddisruptionbudgets"),
    ("coordination.k8s.io/v1", "Lease"): ResourceType("leases"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ResourceType("networkpolicies"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ResourceType(
        "customresourcedefinitions", namespaced=False
    ),
    (f"{contract.API_GROUP}/{contract.API_VERSION}", contract.KIND): ResourceType(contract.PLURAL),
}


def resource_path(
    api_version: str,
    kind: str,
    namespace: str | None = None,
    name: str | None = None,
    *,
    all_namespaces: bool = False,
) -> str:
    """The REST path of a collection (name None) or of one object; `all_namespaces`: a
    namespaced kind's collection across every namespace."""
    try:
        rtype = RESOURCE_TYPES[(api_version, kind)]
    except KeyError:
        raise ValueError(f"pdwarden does not know the resource {api_version} {kind}") from None
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if rtype.namespaced:
        if namespace:
            base += f"/namespaces/{namespace}"
        elif not (all_namespaces and name is None):
            raise ValueError(f"{kind} is namespaced: a namespace is required")
    path = f"{base}/{rtype.plural}"
    return f"{path}/{name}" if name else path


def group_version_plural(api_version: str, kind: str) -> tuple[str, str, str]:
    """(group, version, plural) of a kind the operator knows, as kopf names a resource."""
    group, _, version = api_version.rpartition("/")
    return group, version, RESOURCE_TYPES[(api_version, kind)].plural


def object_path(obj: Obj) -> str:
    meta = obj["metadata"]
    return resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


class KubeClient:
    """Async facade over the sync REST client."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        workers: int = DEFAULT_WORKERS,
        request_timeout: float = REQUEST_TIMEOUT_S,
        thread_name_prefix: str = "pdwarden-kube",
    ) -> None:
        self._api = api_client
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._request_timeout = request_timeout

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, self._request_sync, method, path, body, query, content_type
        )

    def _request_sync(
        self, method: str, path: str, body: Any, query: list[tuple[str, str]] | None, content_type: str
    ) -> Obj:
        try:
            resp = self._api.call_api(
                path,
                method,
                query_params=query or [],
                header_params={"Content-Type": content_type, "Accept": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=self._request_timeout,
            )
        except ApiException as exc:
            raise _api_error(exc, method, path) from None
        except Exception as exc:  # connection refused, timeouts, TLS: no HTTP status at all
            raise KubeApiError(0, type(exc).__name__, str(exc), method=method, path=path) from exc
        data = resp.data
        return json.loads(data) if data else {}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._api.close()


def _retry_after(headers: Any, details: Any) -> float | None:
    raw = None
    if headers is not None:
        raw = headers.get("Retry-After")
    if raw is None and isinstance(details, dict):
        raw = details.get("retryAfterSeconds")
    try:
        value = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and 0 <= value <= 3600 else None


def _api_error(exc: ApiException, method: str, path: str) -> KubeApiError:
    reason, message = str(exc.reason or ""), str(exc.body or "")
    details: Any = None
    try:
        status_obj = json.loads(exc.body or "{}")
        reason = status_obj.get("reason") or reason
        message = status_obj.get("message") or message
        details = status_obj.get("details")
    except (TypeError, ValueError, AttributeError):
        pass
    causes: tuple[str, ...] = ()
    if isinstance(details, dict) and isinstance(details.get("causes"), list):
        causes = tuple(
            str(c.get("type") or c.get("reason") or "") for c in details["causes"] if isinstance(c, dict)
        )
    return KubeApiError(
        int(exc.status or 0),
        reason,
        message,
        method=method,
        path=path,
        causes=causes,
        retry_after=_retry_after(exc.headers, details),
    )


def connect(
    kubeconfig: str | None = None,
    workers: int = DEFAULT_WORKERS,
    request_timeout: float = REQUEST_TIMEOUT_S,
    thread_name_prefix: str = "pdwarden-kube",
) -> KubeClient:
    """From `kubeconfig`, else $KUBECONFIG / ~/.kube/config, else the in-cluster service account.
    Each call is a connection pool and worker threads of its own."""
    cfg = kubernetes.client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path or os.path.exists(os.path.expanduser("~/.kube/config")):
        kubernetes.config.load_kube_config(config_file=path, client_configuration=cfg)
    else:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = workers
    return KubeClient(
        kubernetes.client.ApiClient(cfg),
        workers=workers,
        request_timeout=request_timeout,
        thread_name_prefix=thread_name_prefix,
    )


_client: KubeClient | None = None


def get_client() -> KubeClient:
    """The process-wide client, connected on first use."""
    global _client
    if _client is None:
        _client = connect()
    return _client


def set_client(client: KubeClient | None) -> None:
    global _client
    if _client is not None and client is not _client:
        _client.close()
    _client = client
