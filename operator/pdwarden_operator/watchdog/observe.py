"""A round's observation of one model: its runtime pods, which of them are gone, their scrapes.

`Observer.observe` gathers it once per round into a `ModelObservation`, frozen: the watchdog
controller (remediate.py) and the autoscaler (scaler.py) both read it, and neither changes it.
The observer keeps what rounds need from each other: the scrape histories, the scraper's
connections, which pods the model controls (ownership.py) and its gone pods (gone_list.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pdwarden_contract as contract
from pdwarden_operator import replicas
from pdwarden_operator.cache import ChildStore
from pdwarden_operator.kube import apply as kube_apply
from pdwarden_operator.kube import pods as kube_pods
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.meta import child_name
from pdwarden_operator.resource.watchdog import WatchdogSpec
from pdwarden_operator.watchdog.budget import ScrapeBudget
from pdwarden_operator.watchdog.executor import ModelIdentity
from pdwarden_operator.watchdog.gone_list import GoneList
from pdwarden_operator.watchdog.history import Histories, PodScrape
from pdwarden_operator.watchdog.ownership import Owners
from pdwarden_operator.watchdog.parse import PodSample
from pdwarden_operator.watchdog.pod_cache import PodCache
from pdwarden_operator.watchdog.scrape import Scraper, ScrapeResult, ScrapeTarget
from pdwarden_operator.watchdog.targets import metrics_url, peer_addresses, pod_view
from pdwarden_operator.watchdog.verdict import PodView

log = logging.getLogger("pdwarden.watchdog")

SCRAPE_CONCURRENCY = 100
MAX_STRANGERS_LOGGED = 1024

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ModelObservation:
    """What one round saw of one model."""

    model: ModelIdentity
    spec: DisaggregatedModelSpec  # parsed once, this round
    body: Mapping[str, Any]  # the model as the round read it (status, resourceVersion)
    now: float  # wall clock, once the scrapes were in
    at: float  # the same moment on the monotonic clock (the histories')
    pods: tuple[Obj, ...]  # the model's own runtime pods
    paired: tuple[tuple[PodView, Obj], ...]  # each runtime pod's view with its object
    scraped: tuple[str, ...]  # the pods scraped this round (uids), in order
    histories: Mapping[str, tuple[PodScrape, ...]]  # per pod uid: its recent scrapes, oldest first
    deployments: Mapping[str, Obj | None]  # per runtime role: its Deployment as the watch holds it

    @cached_property
    def views(self) -> dict[str, PodView]:
        return {view.uid: view for view, _ in self.paired}

    @property
    def settings(self) -> WatchdogSpec:
        return self.spec.watchdog

    def desired(self) -> dict[str, int]:
        """Each runtime role's count: the spec's, or an autoscaled role's as its Deployment holds it."""
        return {
            role: replicas.in_effect(self.spec.role(role), replicas.deployed(self.deployments.get(role)))
            for role in contract.RUNTIME_ROLES
        }

    def last_sample(self, uid: str) -> PodSample | None:
        observations = self.histories.get(uid, ())
        return observations[-1].sample if observations else None


class Observer:
    """Observes one model, round after round."""

    def __init__(
        self,
        model: ModelIdentity,
        kube: KubeClient,
        pods: PodCache,
        budget: ScrapeBudget,
        metrics: OperatorMetrics,
        children: ChildStore,
    ) -> None:
        """`children`: the reconciler's child store (the Deployments' counts as the watch holds them)."""
        self.model = model
        self.kube = kube
        self.pod_cache = pods
        self.children = children
        self.budget = budget
        self.metrics = metrics
        self.histories = Histories(keep_seconds=150.0)
        self.scraper: Scraper | None = None
        self.owners = Owners(model.uid, model.namespace)
        self.gone = GoneList(model, kube)
        self._strangers: set[str] = set()  # look-alike pods already logged

    def seen_any(self) -> bool:
        """Whether any pod of the model answered a scrape lately."""
        return any(self.seen(uid) for uid in self.histories.pod_uids())

    def seen(self, uid: str) -> bool:
        history = self.histories.get(uid)
        return history is not None and any(o.sample is not None for o in history.observations())

    async def observe(self, spec: DisaggregatedModelSpec, body: Mapping[str, Any]) -> ModelObservation:
        """The pods, which of the model's pods are gone, their metrics."""
        ns, name = self.model.namespace, self.model.name
        settings = spec.watchdog
        scraper = await self._scraper(settings)
        self.histories.set_keep_seconds(settings.stuck_after_seconds + 3 * settings.scrape_interval_seconds)
        lister = functools.partial(kube_pods.list_namespace_runtime_pods, self.kube)
        listed = await self.pod_cache.pods(ns, name, lister)
        pod_objs = await self._own_pods(listed)
        await self.gone.observe(pod_objs)
        paired, targets = self._targets(pod_objs)
        started = time.perf_counter()
        results = await scraper.scrape(targets)
        self.metrics.scrape_duration.labels(ns, name).observe(time.perf_counter() - started)
        at, now = time.monotonic(), time.time()
        self._record(results, at, {view.uid: view.role for view, _ in paired})
        self.histories.retain(view.uid for view, _ in paired)
        histories = {
            view.uid: h.observations()
            for view, _ in paired
            if (h := self.histories.get(view.uid)) is not None
        }
        deployments = {
            role: self.children.child((ns, name), "Deployment", child_name(name, role))
            for role in contract.RUNTIME_ROLES
        }
        return ModelObservation(
            model=self.model,
            spec=spec,
            body=body,
            now=now,
            at=at,
            pods=tuple(pod_objs),
            paired=tuple(paired),
            scraped=tuple(res.key for res in results),
            histories=histories,
            deployments=deployments,
        )

    async def close(self) -> None:
        if self.scraper is not None:
            await self.scraper.close()

    async def _scraper(self, settings: WatchdogSpec) -> Scraper:
        """The model's scraper, made again when its timeout changed."""
        if self.scraper is None or self.scraper.timeout_seconds != settings.scrape_timeout_seconds:
            await self.close()
            self.scraper = Scraper(
                concurrency=SCRAPE_CONCURRENCY,
                timeout_seconds=settings.scrape_timeout_seconds,
                budget=self.budget,
            )
        return self.scraper

    def _targets(self, pod_objs: Sequence[Obj]) -> tuple[list[tuple[PodView, Obj]], list[ScrapeTarget]]:
        """Each runtime pod's view, and what to scrape: a pod that has never been Ready nor
        answered is starting, not unobserved."""
        # a `peer` label may name only the model's own pods (listed, or gone lately)
        peers = peer_addresses(pod_objs, self.gone.ips())
        paired, targets = [], []
        for obj in pod_objs:
            view = pod_view(obj)
            if view is None:
                continue
            paired.append((view, obj))
            url = metrics_url(obj)
            if url is not None and (view.ready or self.seen(view.uid)):
                targets.append(ScrapeTarget(view.uid, url, peers))
        return paired, targets

    def _record(self, results: Sequence[ScrapeResult], at: float, roles: Mapping[str, str]) -> None:
        """Each scrape into its pod's history; a failed one counted."""
        ns, name = self.model.namespace, self.model.name
        for res in results:
            self.histories.add(res.key, PodScrape(at, res.sample, res.error))
            if res.error is not None:
                self.metrics.scrape_errors.labels(ns, name, roles[res.key]).inc()

    async def _own_pods(self, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The listed pods the model controls (ownership.py); look-alikes are logged once and
        never scraped, judged or touched."""
        await self.owners.learn(listed, functools.partial(kube_apply.get, self.kube))
        own = [p for p in listed if self.owners.ours(p)]
        if len(own) < len(listed):
            for pod in listed:
                meta = pod.get("metadata") or {}
                uid = str(meta.get("uid"))
                if self.owners.ours(pod) or uid in self._strangers:
                    continue
                if len(self._strangers) < MAX_STRANGERS_LOGGED:
                    self._strangers.add(uid)
                    log.warning(
                        "%s/%s: pod %s is labelled as this model's but is not controlled by it: ignored",
                        self.model.namespace,
                        self.model.name,
                        meta.get("name"),
                    )
        return own
