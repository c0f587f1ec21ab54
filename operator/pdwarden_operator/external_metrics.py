"""The external metrics API (external.metrics.k8s.io/v1beta1): each autoscaled role's load, for
the HorizontalPodAutoscaler (or KEDA) that drives a role with `autoscaling.driver: external`.

The API server's aggregation layer reaches it through an APIService (the chart's
`externalMetrics`); only the leader serves it, since only the leader's watchdog rounds see the
load (role_load.py). Every request must come through the front proxy: its client certificate,
checked against the CA the cluster publishes for that (kube/access.py), names the caller in
headers, and a SubjectAccessReview must allow the caller to `list` the metric in the namespace,
as for any resource of the cluster.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from aiohttp import web
from multidict import MultiMapping

import pdwarden_contract as contract
from pdwarden_operator.kube import access
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.timestamps import to_rfc3339
from pdwarden_operator.watchdog.role_load import RoleLoad, RoleLoads

log = logging.getLogger(__name__)

GROUP: Final = "external.metrics.k8s.io"
VERSION: Final = "v1beta1"
GROUP_VERSION: Final = f"{GROUP}/{VERSION}"
# A load older than this is no signal: no item is served, and HPA holds the count.
STALE_AFTER_S: Final = 60.0
REVIEW_TTL_S: Final = 10.0  # how long a SubjectAccessReview's answer is reused
REVIEW_CACHE_MAX: Final = 1024


@dataclass(frozen=True)
class ExternalMetric:
    name: str
    description: str
    value: Callable[[RoleLoad], float | None]


METRICS: Final[dict[str, ExternalMetric]] = {
    m.name: m
    for m in (
        ExternalMetric(
            "pdwarden_role_inflight_requests",
            "Requests in flight on the role's counted pods, summed (target type AverageValue: per pod).",
            lambda load: load.inflight,
        ),
        ExternalMetric(
            "pdwarden_role_kv_pages_in_use",
            "KV-cache pages in use on the role's counted pods, summed (decode; AverageValue: per pod).",
            lambda load: load.pages_in_use,
        ),
        ExternalMetric(
            "pdwarden_role_queue_age_seconds",
            "Age of the oldest request in flight on the role's counted pods (prefill; target type Value).",
            lambda load: load.queue_age,
        ),
        ExternalMetric(
            "pdwarden_role_counted_pods",
            "The role's pods that count: ready, scraped and not judged wedged.",
            lambda load: float(load.pods),
        ),
    )
}


# --- label selectors ------------------------------------------------------------------------

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")


class SelectorError(ValueError):
    pass


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # in, notin, exists, !exists
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # notin (and !=): a missing key matches


def parse_selector(text: str) -> list[Requirement]:
    """A label selector in the API's string form (`a=b,c!=d,e in (x,y),!f`)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    out: list[Requirement] = []
    for raw in parts:
        part = raw.strip()
        if not part:
            if text.strip():
                raise SelectorError(f"empty requirement in label selector {text!r}")
            continue
        if m := _EQUALITY.match(part):
            op = "notin" if m.group(2) == "!=" else "in"
            out.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
        elif m := _SET.match(part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise SelectorError(f"invalid value in {part!r}")
            out.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EXISTS.match(part):
            out.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"cannot parse {part!r} in label selector {text!r}")
    return out


# --- documents --------------------------------------------------------------------------------


def quantity(value: float) -> str:
    """A resource.Quantity in milli-units (HPA compares quantities, exact to 1/1000)."""
    milli = round(value * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def metric_items(
    loads: Mapping[tuple[str, str, str], RoleLoad], metric: ExternalMetric, selector: Sequence[Requirement]
) -> list[dict[str, Any]]:
    """One item per role that the selector picks and that has a signal (a role with no counted
    pod, or without the figure, has none: HPA then holds its count)."""
    items = []
    for (_, model, role), load in sorted(loads.items()):
        labels = {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role}
        value = metric.value(load)
        if load.pods == 0 or value is None or not all(r.matches(labels) for r in selector):
            continue
        items.append(
            {
                "metricName": metric.name,
                "metricLabels": labels,
                "timestamp": to_rfc3339(load.observed_at),
                "value": quantity(value),
            }
        )
    return items


def value_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}


def resource_list() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": name,
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
            for name in METRICS
        ],
    }


def api_group() -> dict[str, Any]:
    version = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def failure(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return web.json_response({**body, "message": message, "reason": reason, "code": code}, status=code)


# --- the caller -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    user: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class Unauthenticated(Exception):
    pass


def caller_of(
    front: access.FrontProxy, peer_common_name: str | None, headers: MultiMapping[str]
) -> Caller | None:
    """The caller the front proxy names, or None when it names none (discovery by the proxy
    itself). Raises Unauthenticated when the request did not come through the front proxy."""
    if peer_common_name is None:
        raise Unauthenticated("no client certificate signed by the front proxy's CA")
    if front.allowed_names and peer_common_name not in front.allowed_names:
        raise Unauthenticated(f"client certificate {peer_common_name!r} is not the front proxy's")
    user = next((headers[h] for h in front.username_headers if headers.get(h)), "")
    if not user:
        return None
    groups = tuple(v for h in front.group_headers for v in headers.getall(h, []))
    extra: dict[str, list[str]] = {}
    for name in {k.lower(): k for k in headers}.values():  # a repeated header once
        for prefix in front.extra_headers_prefixes:
            if name.lower().startswith(prefix.lower()):
                key = unquote(name[len(prefix) :]).lower()
                extra.setdefault(key, []).extend(headers.getall(name, []))
    return Caller(user, groups, tuple((k, tuple(v)) for k, v in sorted(extra.items())))


def _peer_common_name(request: web.Request) -> str | None:
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# --- the server -------------------------------------------------------------------------------


class ExternalMetricsApi:
    def __init__(self, kube: KubeClient, front: access.FrontProxy, loads: RoleLoads | None = None) -> None:
        """`kube`: the client the access reviews are asked with."""
        self.kube = kube
        self.front = front
        self.loads = loads if loads is not None else RoleLoads()  # the watchdog context's, when served
        self._reviews: OrderedDict[tuple[Caller, str, str], tuple[bool, str, float]] = OrderedDict()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis", self._groups)
        app.router.add_get(f"/apis/{GROUP}", self._group)
        app.router.add_get(f"/apis/{GROUP_VERSION}", self._resources)
        app.router.add_get(f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/{{metric}}", self._values)
        app.router.add_get("/healthz", self._healthz)
        return app

    def _caller(self, request: web.Request) -> Caller | None:
        return caller_of(self.front, _peer_common_name(request), request.headers)

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _discovery(self, request: web.Request, doc: dict[str, Any]) -> web.Response:
        try:
            self._caller(request)
        except Unauthenticated as exc:
            return failure(401, "Unauthorized", str(exc))
        return web.json_response(doc)

    async def _groups(self, request: web.Request) -> web.Response:
        return await self._discovery(
            request, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}
        )

    async def _group(self, request: web.Request) -> web.Response:
        return await self._discovery(request, api_group())

    async def _resources(self, request: web.Request) -> web.Response:
        return await self._discovery(request, resource_list())

    async def _values(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["metric"]
        try:
            caller = self._caller(request)
        except Unauthenticated as exc:
            return failure(401, "Unauthorized", str(exc))
        if caller is None:
            return failure(401, "Unauthorized", "the front proxy named no user")
        metric = METRICS.get(name)
        if metric is None:  # before the review: a made-up name costs the API server nothing
            return failure(404, "NotFound", f"no external metric {name!r}; served: {', '.join(METRICS)}")
        allowed, reason = await self._review(caller, namespace, name)
        if not allowed:
            why = f": {reason}" if reason else ""
            return failure(
                403,
                "Forbidden",
                f'{caller.user} cannot list resource "{name}" in API group "{GROUP}" '
                f'in namespace "{namespace}"{why}',
            )
        try:
            selector = parse_selector(request.query.get("labelSelector", ""))
        except SelectorError as exc:
            return failure(400, "BadRequest", str(exc))
        fresh = self.loads.in_namespace(namespace, time.time() - STALE_AFTER_S)
        return web.json_response(value_list(metric_items(fresh, metric, selector)))

    async def _review(self, caller: Caller, namespace: str, metric: str) -> tuple[bool, str]:
        key = (caller, namespace, metric)
        now = time.monotonic()
        cached = self._reviews.get(key)
        if cached is not None and cached[2] > now:
            self._reviews.move_to_end(key)
            return cached[0], cached[1]
        attributes = {
            "namespace": namespace,
            "verb": "list",
            "group": GROUP,
            "version": VERSION,
            "resource": metric,
        }
        try:
            allowed, reason = await access.may(
                self.kube, caller.user, caller.groups, dict(caller.extra), attributes
            )
        except KubeApiError as exc:
            return False, f"the access review failed: {exc}"
        self._reviews[key] = (allowed, reason, now + REVIEW_TTL_S)
        self._reviews.move_to_end(key)
        while len(self._reviews) > REVIEW_CACHE_MAX:  # the least recently used answer goes
            self._reviews.popitem(last=False)
        return allowed, reason


def tls_context(tls_dir: Path, front: access.FrontProxy) -> ssl.SSLContext:
    """Serve with tls.crt/tls.key from `tls_dir`; accept client certificates of the front
    proxy's CA (the caller is checked per request: discovery needs the proxy, data a user)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls_dir / "tls.crt", tls_dir / "tls.key")
    ctx.load_verify_locations(cadata=front.client_ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


async def serve(
    kube: KubeClient, host: str, port: int, tls_dir: Path, loads: RoleLoads
) -> web.AppRunner | None:
    """Start the API, its reads and reviews sent with `kube`; None (logged) when the cluster has
    no aggregation layer to reach it."""
    front = await access.read_front_proxy(kube)
    if front is None:
        log.error(
            "external metrics API not served: the cluster publishes no front-proxy CA "
            "(%s/%s has no requestheader-client-ca-file: the API server runs without "
            "--requestheader-client-ca-file)",
            *access.AUTH_CONFIGMAP,
        )
        return None
    runner = web.AppRunner(ExternalMetricsApi(kube, front, loads).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls_context(tls_dir, front)).start()
    log.info("external metrics API (%s) on https://%s:%d", GROUP_VERSION, host, port)
    return runner
