"""One reconcile pass of a DisaggregatedModel, in a straight line (`reconcile`): observe
(`observe.py`) -> plan (`planner.py`, pure) -> execute (`executor.py`, every API write) -> one
status write (`report.py`). What a pass reads and writes besides the model and its children
comes in `ReconcileParts` (the operator's context builds one), the API client included."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdwarden_operator import plan
from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.podpolicy import PodPolicy
from pdwarden_operator.reconcile.errors import Refused
from pdwarden_operator.reconcile.executor import Executed, execute, names
from pdwarden_operator.reconcile.observation import Observation
from pdwarden_operator.reconcile.observe import Baseline, observe, read_owner
from pdwarden_operator.reconcile.planner import plan_pass, render_inputs
from pdwarden_operator.reconcile.report import report, report_refusal
from pdwarden_operator.render.meta import Obj
from pdwarden_operator.status_writer import StatusWriter


@dataclass(frozen=True)
class ReconcileParts:
    """What a pass reads and writes besides the model and its children: the API client, the
    one status writer, the namespaces' baseline of workloads and the installation's pod policy."""

    kube: KubeClient
    writer: StatusWriter
    baseline: Baseline
    pod_policy: PodPolicy


@dataclass
class PassResult:
    """What one pass did: the status it computed and the children the API server returned."""

    status: Obj
    applied: list[Obj] = field(default_factory=list)
    # `plan.settled_key` when the pass found nothing to apply or delete, else None: the next
    # pass with the same key skips render and compare.
    settled: Hashable | None = None

    @property
    def applied_names(self) -> list[str]:
        return names(self.applied)


async def reconcile(
    parts: ReconcileParts,
    body: Mapping[str, Any],
    children: Mapping[tuple[str, str], Obj],
    settled_before: Hashable | None = None,
    *,
    verify_secret: bool = False,
) -> PassResult:
    """One straight line for every cause (create, resume, spec change, a child's event, the
    periodic resync): observe -> plan (pure) -> execute -> one status write. `parts`: the
    client, writer, baseline and pod policy of the operator's context. `children`: what the watches hold
    (ours for sure). `settled_before`: the last pass's `PassResult.settled`. `verify_secret`:
    make sure the worker key's Secret still exists (one dry-run). A refusal (the spec, or a
    child the API server refused) is written to status and raised as InvalidSpec (kopf is not
    imported here; handlers.py translates the exceptions of `errors.py` into kopf's). An
    unchanged, healthy model costs no API call, so a thousand of them resynced or resumed cost
    render and compare only."""
    try:
        obs = await observe(
            parts.kube,
            body,
            children,
            settled_before,
            pod_policy=parts.pod_policy,
            baseline=parts.baseline,
            writer=parts.writer,
            verify_secret=verify_secret,
        )
        decided = plan_pass(obs)
        done = await execute(parts.kube, obs, decided)
    except Refused as refusal:
        raise await report_refusal(parts.writer, body, refusal) from (refusal.__cause__ or refusal)
    status = await report(parts.kube, parts.writer, obs, done)
    if done.applied or done.deleted:
        assert done.desired is not None
        settled_now = await _settled_after(parts.kube, parts.baseline, obs, done)
        return PassResult(status, list(done.applied), settled_now)
    matched = done.children.keys() == children.keys()  # the cluster matched the render
    return PassResult(status, list(done.applied), decided.settled if matched else None)


async def _settled_after(
    kube: KubeClient, baseline: Baseline, obs: Observation, done: Executed
) -> Hashable | None:
    """The `plan.settled_key` of the children as a pass that applied or deleted left them, when
    they cover its render and the next pass would render the same (its owner, computed from these
    children, has the same inputs); else None. The watch then brings back what the pass wrote at
    the same generations, and the controllers' status updates leave those alone: without this, each
    of them rendered and compared a new model again."""
    after = await read_owner(kube, baseline, obs.body, obs.spec, done.children, verify=False)
    inputs = render_inputs(obs.body, after)
    if inputs != render_inputs(obs.body, done.rendered_for):
        return None
    desired = list(done.desired or ())
    if plan.to_apply(desired, done.children) or plan.to_delete(desired, done.children):
        return None
    return plan.settled_key(inputs, done.children)
