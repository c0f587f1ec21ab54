"""One Kubernetes API connection for the operator, used from asyncio.

kopf has no general-purpose client, so requests go through an aiohttp session of our own
(its connection pool bounds the requests in flight), authenticated as `credentials.discover`
finds. Responses are parsed as plain JSON dicts: no generated model classes.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import tempfile
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

import pdwarden_contract as contract
from pdwarden_operator.kube.credentials import Credentials, discover

Obj = dict[str, Any]
# A request's bound, from when it has a connection: a burst queued behind the pool (a thousand
# models at once) waits its turn rather than timing out against a healthy API server.
REQUEST_TIMEOUT_S = 30
# Requests in flight at once per client; more wait for a free connection.
DEFAULT_CONNECTIONS = 16
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


class _Pool(NamedTuple):
    """A client's session, the slots that bound its requests in flight, and the loop both
    belong to: made together, replaced together."""

    session: aiohttp.ClientSession
    slots: asyncio.Semaphore
    loop: asyncio.AbstractEventLoop


class KubeClient:
    """Requests to one API server over one connection pool. The session is made on the loop
    that first uses it (and again on another loop: a session serves one loop only)."""

    def __init__(
        self,
        creds: Credentials,
        max_connections: int = DEFAULT_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.creds = creds
        self._max_connections = max_connections
        self._request_timeout = request_timeout
        self._ssl = _tls_context(creds)
        self._pool: _Pool | None = None

    def _session_here(self) -> tuple[aiohttp.ClientSession, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool.session.closed or self._pool.loop is not loop:
            session = aiohttp.ClientSession(
                # the slots bound the connections; aiohttp's own limit and total timeout would
                # count the wait for a pooled connection in the request's time
                connector=aiohttp.TCPConnector(limit=0, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=None),
                trust_env=False,  # proxies from the environment never see our credentials
            )
            self._pool = _Pool(session, asyncio.Semaphore(self._max_connections), loop)
        return self._pool.session, self._pool.slots

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        session, slots = self._session_here()
        try:
            if token := self.creds.bearer():  # a token file unreadable for a moment: retried
                headers["Authorization"] = f"Bearer {token}"
            async with (
                slots,  # one of the pool's connections is this request's: its time starts now
                asyncio.timeout(self._request_timeout),
                session.request(
                    method, self.creds.server + path, params=query or None, data=data, headers=headers
                ) as resp,
            ):
                status, reason, answer_headers, raw = (
                    resp.status,
                    resp.reason,
                    resp.headers,
                    await resp.read(),
                )
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            # connection refused, timeouts, TLS: no HTTP status at all
            raise KubeApiError(0, type(exc).__name__, str(exc), method=method, path=path) from exc
        if status >= 400:
            raise _api_error(status, reason or "", raw, answer_headers, method, path)
        return json.loads(raw) if raw else {}

    async def aclose(self) -> None:
        """Close the session, from the loop that uses it (whoever connected the client does)."""
        if self._pool is not None and not self._pool.session.closed:
            await self._pool.session.close()


def _tls_context(creds: Credentials) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(creds.ca_file))
    if creds.cert_file is not None and creds.key_file is not None:
        context.load_cert_chain(str(creds.cert_file), str(creds.key_file))
    return context


def _retry_after(headers: Mapping[str, str] | None, details: Any) -> float | None:
    raw: Any = None
    if headers is not None:
        raw = headers.get("Retry-After")
    if raw is None and isinstance(details, dict):
        raw = details.get("retryAfterSeconds")
    try:
        value = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    return value if value is not None and 0 <= value <= 3600 else None


def _api_error(
    status: int, reason: str, body: bytes | None, headers: Mapping[str, str] | None, method: str, path: str
) -> KubeApiError:
    """The error for an answer of 400 or more, from the Status object it carries if any."""
    message = (body or b"").decode(errors="replace")
    details: Any = None
    try:
        status_obj = json.loads(body or b"{}")
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
        status,
        reason,
        message,
        method=method,
        path=path,
        causes=causes,
        retry_after=_retry_after(headers, details),
    )


def connect(
    kubeconfig: str | None = None,
    max_connections: int = DEFAULT_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT_S,
) -> KubeClient:
    """From `kubeconfig`, else $KUBECONFIG / ~/.kube/config, else the in-cluster service account
    (`credentials.discover`; `KubeconfigError` when none can be used). Each call is a connection
    pool of its own; a kubeconfig's inline certificates live in a private directory removed with
    the client (in a pod, none is made)."""
    made: list[Path] = []

    def files() -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="pdwarden-kube-")))
        return made[-1]

    try:
        client = KubeClient(discover(kubeconfig, files), max_connections, request_timeout)
    except BaseException:
        for directory in made:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    for directory in made:
        weakref.finalize(client, shutil.rmtree, directory, True)
    return client
