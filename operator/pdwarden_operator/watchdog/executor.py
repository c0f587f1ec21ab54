"""Perform a plan's actions and announce its decisions: the watchdog's only side effects on pods.

Every decision becomes an Event on the DisaggregatedModel (and on the pod when there is one)
and a count in pdwarden_operator_remediations_total; API failures become outcomes, never
exceptions, so one bad call cannot stop the watchdog. What an action acts on comes with it
(`Action.target`: a pod, or a group's ranks): the executor keeps no per-round configuration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import pdwarden_contract as contract
from pdwarden_operator.kube import events, pods
from pdwarden_operator.kube.client import KubeApiError, KubeClient
from pdwarden_operator.kube.model_status import DM_API_VERSION
from pdwarden_operator.metrics import OperatorMetrics
from pdwarden_operator.timestamps import to_rfc3339
from pdwarden_operator.watchdog.ladder import Action, ActionKind, ActionResult, Notice, Plan
from pdwarden_operator.watchdog.outcome import Outcome

log = logging.getLogger("pdwarden.watchdog")

# Each step's outcome once the API did it (a pod already gone: POD_GONE).
DONE: Mapping[ActionKind, Outcome] = {
    "alert": Outcome.ALERTED,
    "quarantine": Outcome.QUARANTINED,
    "restart": Outcome.DELETED,
    "finish-drain": Outcome.DELETED,
    "evict": Outcome.EVICTED,
}
# Steps that only report: they touch no pod, so they need no proof of leadership.
REPORT_ONLY: frozenset[ActionKind] = frozenset({"alert"})


@dataclass(frozen=True)
class ModelIdentity:
    namespace: str
    name: str
    uid: str


class NotLeading(Exception):
    """This replica no longer holds the leader Lease: nothing more may be performed."""


class Executor:
    def __init__(
        self,
        model: ModelIdentity,
        kube: KubeClient,
        metrics: OperatorMetrics,
        may_act: Callable[[], Awaitable[bool]],
    ) -> None:
        """`may_act`: whether this replica still leads (`leader.Leadership.still_leading`)."""
        self.model = model
        self.kube = kube
        self.metrics = metrics
        self.may_act = may_act

    async def perform(self, plan: Plan) -> list[ActionResult]:
        results = []
        for action in plan.actions:
            # Proven just before each pod is touched: a replica paused or cut off since the
            # round began must leave the action to the current leader (it resumes the intent).
            if action.kind not in REPORT_ONLY and not await self.may_act():
                raise NotLeading(f"not the leader any more: {action.kind} of {action.pod} left to the leader")
            results.append(await self._perform(action))
        for notice in plan.notices:
            await self._announce_notice(notice)
        return results

    def _owner(self) -> dict[str, str]:
        return {
            "apiVersion": DM_API_VERSION,
            "kind": contract.KIND,
            "name": self.model.name,
            "uid": self.model.uid,
        }

    async def _call(self, action: Action) -> str:
        """The API calls of one step on its unit: "done", or "gone" when the pod was gone."""
        ns, unit = self.model.namespace, action.target
        if action.kind in REPORT_ONLY:
            return "done"
        if unit.kind == "group":
            return await self._restart_group(action, unit.ranks)
        if action.kind == "quarantine":
            return await pods.quarantine_pod(
                self.kube, ns, unit.name, unit.uid, self._owner(), to_rfc3339(time.time())
            )
        if action.kind == "evict":
            return await pods.evict_pod(self.kube, ns, unit.name, unit.uid)
        return await pods.delete_pod(self.kube, ns, unit.name, unit.uid)  # restart, finish-drain

    async def _perform(self, action: Action) -> ActionResult:
        ns = self.model.namespace
        try:
            done = await self._call(action)
            result = ActionResult(action, DONE[action.kind] if done == "done" else Outcome.POD_GONE)
        except pods.EvictionRefused as refused:
            kind = Outcome.REFUSED_BY_PDB if refused.outcome == "refused-by-pdb" else Outcome.THROTTLED
            result = ActionResult(action, kind, str(refused), retry_after=refused.retry_after)
        except KubeApiError as exc:
            result = ActionResult(action, Outcome.ERROR, f"{exc.status} {exc.reason}: {exc.message[:300]}")
        except Exception as exc:  # never let an unexpected failure end the watchdog
            log.exception("%s/%s: %s of %s failed", ns, self.model.name, action.kind, action.pod)
            result = ActionResult(action, Outcome.ERROR, f"{type(exc).__name__}: {exc}")
        self.metrics.remediations.labels(ns, self.model.name, action.remediation, result.outcome.value).inc()
        await self._announce_result(result)
        return result

    async def _restart_group(self, action: Action, ranks: Sequence[tuple[str, str]]) -> str:
        """Every rank of the group goes at once (its StatefulSet starts them again together: a
        lone rank never rejoins a stale group). `evict` asks the Eviction API for the leader
        first, so the PodDisruptionBudget is honoured for the group; the other ranks cannot
        serve without it and are deleted."""
        ns = self.model.namespace
        first = "gone"
        for i, (name, uid) in enumerate(ranks):
            if action.kind == "evict" and i == 0:
                done = await pods.evict_pod(self.kube, ns, name, uid)
            else:
                done = await pods.delete_pod(self.kube, ns, name, uid)
            first = "done" if done == "done" else first
        return first

    async def _announce_result(self, result: ActionResult) -> None:
        a = result.action
        if a.resumed and result.outcome == a.previous_outcome:
            return  # the same refusal or error again: already announced
        resumed = (
            " (resuming a remediation decided earlier)"
            if a.resumed and a.previous_outcome == Outcome.PENDING
            else ""
        )
        what: dict[Outcome, tuple[str, str, Literal["Normal", "Warning"]]] = {
            Outcome.QUARANTINED: (
                "WedgedPodQuarantined",
                f"quarantined wedged {a.role} pod {a.pod}{resumed}: out of its Deployment's selector "
                f"and the router, a replacement starts now; deleted once drained: {a.reason}",
                "Warning",
            ),
            Outcome.ALERTED: (
                "PodWedged",
                f"{a.role} pod {a.pod} is wedged: {a.reason}. watchdog.action is alert: reporting only",
                "Warning",
            ),
            Outcome.DELETED: (
                "WedgedPodRestarted",
                f"deleted wedged {a.role} pod {a.pod} so its Deployment replaces it{resumed}: {a.reason}",
                "Warning",
            )
            if a.kind == "restart"
            else (
                "DrainedPodDeleted",
                f"deleted quarantined {a.role} pod {a.pod}, aborting what it still held{resumed}: {a.reason}",
                "Warning",
            ),
            Outcome.EVICTED: (
                "WedgedPodEvicted",
                f"evicted wedged {a.role} pod {a.pod}{resumed}: {a.reason}",
                "Warning",
            ),
            Outcome.REFUSED_BY_PDB: (
                "EvictionRefused",
                f"eviction of wedged {a.role} pod {a.pod} refused by its "
                "PodDisruptionBudget; retrying each round, not bypassing it",
                "Warning",
            ),
            Outcome.THROTTLED: (
                "EvictionThrottled",
                f"eviction of wedged {a.role} pod {a.pod} throttled by the API server "
                f"({result.message}); retrying when it allows",
                "Normal",
            ),
            Outcome.POD_GONE: (
                "WedgedPodGone",
                f"wedged {a.role} pod {a.pod} was already gone{resumed}",
                "Normal",
            ),
            Outcome.ERROR: (
                "RemediationError",
                f"{a.kind} of wedged {a.role} pod {a.pod} failed: {result.message}; retrying",
                "Warning",
            ),
        }
        group = a.target.kind == "group"
        if group and result.outcome in (Outcome.DELETED, Outcome.EVICTED):
            what[result.outcome] = (
                "GroupRestarted",
                f"restarted {a.role} group {a.pod} as a whole ({len(a.target.ranks)} pods "
                f"{'evicted and ' if a.kind == 'evict' else ''}deleted together){resumed}: {a.reason}",
                "Warning",
            )
        reason, message, kind = what[result.outcome]
        log.warning("%s/%s: %s: %s", self.model.namespace, self.model.name, reason, message)
        await self._post(None if group else a.pod, a.uid, reason, message, kind)

    async def _announce_notice(self, notice: Notice) -> None:
        if notice.outcome is not None:
            self.metrics.remediations.labels(
                self.model.namespace, self.model.name, notice.action, notice.outcome.value
            ).inc()
        log.warning(
            "%s/%s: %s: %s", self.model.namespace, self.model.name, notice.event_reason, notice.message
        )
        # (a group is no Pod: its one Event is the model's)
        pod = notice.pod if notice.kind == "pod" else None
        await self._post(pod, "", notice.event_reason, notice.message, "Warning")

    async def post_model_event(self, reason: str, message: str, kind: Literal["Normal", "Warning"]) -> None:
        await self._post(None, "", reason, message, kind)

    async def _post(
        self, pod: str | None, pod_uid: str, reason: str, message: str, kind: Literal["Normal", "Warning"]
    ) -> None:
        ns = self.model.namespace
        await events.post_event(
            self.kube,
            events.involved(DM_API_VERSION, contract.KIND, ns, self.model.name, self.model.uid),
            reason,
            message,
            kind,
        )
        if pod:
            await events.post_event(
                self.kube, events.involved("v1", "Pod", ns, pod, pod_uid), reason, message, kind
            )
