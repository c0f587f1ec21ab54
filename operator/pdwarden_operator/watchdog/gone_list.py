"""One model's list of gone runtime pods as the watchdog keeps it (gone_pods.py holds the pure
parts): read back once from its ConfigMap, a pod missing from the listing confirmed gone by the
API server, and published again when it changed. Every failure is logged and tried again next
round, never the round's failure.

The ConfigMap is written here, not by the reconciler: its content is what the watchdog saw
(deletions completed), not something rendered from the spec.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from pdwarden_operator.kube import configmaps as kube_configmaps
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.render.gone_pods import gone_pods_configmap, gone_pods_name
from pdwarden_operator.render.meta import Owner
from pdwarden_operator.watchdog.executor import ModelIdentity
from pdwarden_operator.watchdog.gone_pods import GonePods, from_json, published, seen, to_json

log = logging.getLogger("pdwarden.watchdog")


class GoneList:
    def __init__(self, model: ModelIdentity, kube: KubeClient) -> None:
        self.model = model
        self.kube = kube
        self.gone: GonePods | None = None  # read back from its ConfigMap on the first round
        self._unwritten = False
        self._foreign = False  # a ConfigMap of the list's name is not the model's

    def ips(self) -> list[str]:
        """The addresses of the model's gone pods (a runtime's `peer` label may name them)."""
        return [g.ip for g in self.gone.entries()] if self.gone is not None else []

    async def observe(self, pod_objs: Sequence[dict[str, Any]]) -> None:
        """Which of the model's runtime pods are gone: the published list read once, a pod
        missing from the listing confirmed gone by the API server."""
        ns, name = self.model.namespace, self.model.name
        try:
            if self.gone is None:
                _, document = await self._published()
                self.gone = GonePods(from_json(document))
            listed = [s for obj in pod_objs if (s := seen(obj)) is not None]
            confirmed = [
                p.uid
                for p in self.gone.missing(listed)
                if await kube_configmaps.pod_gone(self.kube, ns, p.name, p.uid)
            ]
            self._unwritten |= self.gone.observe(listed, confirmed, time.time())
        except Exception as exc:  # never the round's failure: judging and remediating go on
            log.warning("%s/%s: reading the gone runtime pods: %s", ns, name, exc)

    async def publish(self) -> None:
        """The list written for the decodes holding pages for its pods, when it changed."""
        ns, name = self.model.namespace, self.model.name
        if self.gone is None or not self._unwritten:
            return
        try:
            ours, _ = await self._published()
            if not ours:  # written once the name is free (the list stays unwritten until then)
                return
            owner = Owner(name=name, namespace=ns, uid=self.model.uid)
            await kube_configmaps.write(self.kube, gone_pods_configmap(owner, to_json(self.gone.entries())))
            self._unwritten = False
        except Exception as exc:
            log.warning("%s/%s: publishing the gone runtime pods: %s", ns, name, exc)

    async def _published(self) -> tuple[bool, str | None]:
        """`gone_pods.published` of the model's ConfigMap as the API server holds it; a foreign
        one is logged when first found."""
        ns, name = self.model.namespace, self.model.name
        cm_name = gone_pods_name(name)
        ours, document = published(await kube_configmaps.read(self.kube, ns, cm_name), self.model.uid)
        if not ours and not self._foreign:
            log.warning(
                "%s/%s: ConfigMap %s exists and is not this model's: its gone pods are neither read "
                "from it nor written to it",
                ns,
                name,
                cm_name,
            )
        self._foreign = not ours
        return ours, document
