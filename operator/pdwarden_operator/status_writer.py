"""The one writer of DisaggregatedModel status.

Two parts of the operator learn things about a model: the reconciler observes its
Deployments (an `Observed`), the watchdog finds wedges and records remediations (the
`watchdog` and `remediations` keys). Both hand what they learned to `StatusWriter`, which
keeps the latest of each per model and computes phase and conditions from BOTH with one pure
function (`status.compose`). Neither input is rebuilt from the other's output, so the two
can no longer disagree about a condition (a stalled rollout and a wedge together give one
stable set of conditions), and no write carries a key its writer did not compute: until the
reconciler has observed a model in this process, a watchdog write leaves conditions, phase
and replica counts as they are.

The patch itself goes through `kube.model_status.patch_status` (`patching_through` the operator's
client); a watchdog intent may carry the resourceVersion it read, so a concurrent writer makes
it fail with 409 instead of acting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.kube.model_status import patch_status
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.status import Observed, compose, invalid_spec_status

Key = tuple[str, str]
Patcher = Callable[[str, str, dict[str, Any], str | None], Awaitable[None]]
# The watchdog's keys; the reconciler's are everything compose() adds besides these.
WATCHDOG_KEYS = ("watchdog", "remediations", "autoscaling")


def patching_through(client: KubeClient) -> Patcher:
    """The status writer's patches, sent with `client`."""

    async def patch(namespace: str, name: str, status: dict[str, Any], resource_version: str | None) -> None:
        await patch_status(client, namespace, name, status, resource_version=resource_version)

    return patch


@dataclass
class _Model:
    known: dict[str, Any]  # the status as this process last saw or wrote it
    spec: DisaggregatedModelSpec | None = None
    observed: Observed | None = None
    invalid: str | None = None  # the message while the spec does not validate
    findings: dict[str, Any] | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class StatusWriter:
    """One per process (the operator's context, context.py): the reconciler and every
    model's watchdog write through the same one."""

    def __init__(self, patch: Patcher, clock: Callable[[], datetime] | None = None) -> None:
        self._patch = patch
        self._clock = clock
        self._models: dict[Key, _Model] = {}

    def _model(self, body: Mapping[str, Any]) -> tuple[Key, _Model]:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = _Model(known=dict(body.get("status") or {}))
        return key, model

    def forget(self, namespace: str, name: str) -> None:
        """The model is gone (model_registry.py): what this process knew of its status too."""
        self._models.pop((namespace, name), None)

    def _now(self) -> datetime | None:
        return self._clock() if self._clock else None

    def _composed(self, model: _Model) -> dict[str, Any]:
        if model.invalid is not None:
            generation = model.observed.generation if model.observed else 0
            previous = Observed(generation, previous_conditions=tuple(model.known.get("conditions") or ()))
            return {**(model.findings or {}), **invalid_spec_status(model.invalid, previous, now=self._now())}
        if model.spec is None:
            return dict(model.findings or {})
        return compose(model.spec, model.observed, model.findings, model.known, now=self._now())

    async def _write(
        self, key: Key, model: _Model, composed: Mapping[str, Any], resource_version: str | None
    ) -> bool:
        changed = {k: v for k, v in composed.items() if model.known.get(k) != v}
        if not changed and resource_version is None:
            return False
        await self._patch(key[0], key[1], changed, resource_version)
        model.known.update(changed)
        return True

    async def observed(
        self, body: Mapping[str, Any], spec: DisaggregatedModelSpec, observed: Observed
    ) -> tuple[dict[str, Any], bool]:
        """The reconciler's observation; returns (the status it implies, whether it was written)."""
        key, model = self._model(body)
        async with model.lock:
            model.spec, model.observed, model.invalid = spec, observed, None
            composed = self._composed(model)
            return composed, await self._write(key, model, composed, None)

    def preview(
        self, body: Mapping[str, Any], spec: DisaggregatedModelSpec, observed: Observed
    ) -> dict[str, Any]:
        """The status the reconciler's `observed` would imply, computed and not written (to
        decide whether something more is worth observing first)."""
        _, model = self._model(body)
        return self._composed(replace(model, spec=spec, observed=observed, invalid=None))

    async def invalid(self, body: Mapping[str, Any], message: str, generation: int) -> dict[str, Any]:
        """The spec does not validate: Degraded with `message` until it changes."""
        key, model = self._model(body)
        async with model.lock:
            model.invalid = message
            model.observed = Observed(generation)
            composed = self._composed(model)
            await self._write(key, model, composed, None)
            return composed

    async def findings(
        self,
        body: Mapping[str, Any],
        spec: DisaggregatedModelSpec,
        findings: Mapping[str, Any],
        *,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """The watchdog's findings (`watchdog`, `remediations`, `autoscaling`); written with
        `resource_version` as a precondition when given (an intent: a 409 means another writer,
        do not act)."""
        key, model = self._model(body)
        async with model.lock:
            previous = model.findings
            model.spec = model.spec or spec
            model.findings = {k: findings[k] for k in WATCHDOG_KEYS if k in findings}
            composed = self._composed(model)
            try:
                await self._write(key, model, composed, resource_version)
            except Exception:
                model.findings = previous  # not written: the next round decides again
                raise
            return composed

    def refused(self, namespace: str, name: str, generation: int) -> bool:
        """Whether the reconciler's last observation of the model says the API server refused
        a child of `generation` (`ApplyFailed`)."""
        model = self._models.get((namespace, name))
        observed = model.observed if model is not None else None
        return (
            observed is not None
            and observed.generation == generation
            and observed.error_reason == "ApplyFailed"
        )

    def known(self, namespace: str, name: str) -> Mapping[str, Any]:
        model = self._models.get((namespace, name))
        return dict(model.known) if model else {}
