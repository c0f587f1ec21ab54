"""Action drain end to end: a wedged prefill pod is quarantined, replaced, drained and deleted
under steady traffic; a drain interrupted by the operator's death is finished by the next one.

Harness: testkit/pdwarden_testkit/cluster_env.py (2 prefill + 2 decode synthetic pods, router-like load,
the emulated port's race wedging ONE prefill pod).
"""

from __future__ import annotations

from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    EMULATED_PORT_PREFILL,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    assert_each_pod_acted_on_once,
    epoch,
    remediations,
    up,
    wedge,
)

pytestmark = pytest.mark.e2e

DRAIN_SECONDS = 150
DRAIN = {**WATCHDOG, "action": "drain", "drainSeconds": DRAIN_SECONDS}


def model_pods(env: Env, name: str) -> dict[str, dict[str, Any]]:
    """Every pod of the model by uid, quarantined ones included."""
    sel = f"{contract.LABEL_MODEL}={name}"
    items = env.call("GET", f"/api/v1/namespaces/{env.namespace}/pods?labelSelector={sel}")["items"]
    return {p["metadata"]["uid"]: p for p in items}


def phases(entry: dict[str, Any]) -> list[str]:
    return [p["phase"] for p in entry.get("phases") or []]


def ready_since(pod: dict[str, Any]) -> float:
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert cond["status"] == "True", pod["status"]
    return epoch(cond["lastTransitionTime"])


def assert_quarantined(env: Env, name: str, pod: dict[str, Any]) -> None:
    labels, owners = pod["metadata"]["labels"], pod["metadata"].get("ownerReferences") or []
    assert labels[contract.LABEL_ROLE] == contract.ROLE_QUARANTINED
    assert labels[contract.LABEL_QUARANTINED_ROLE] == contract.ROLE_PREFILL
    assert labels[contract.LABEL_QUARANTINE_REASON] == contract.QUARANTINE_REASON_WEDGED
    model_uid = env.dm(name)["metadata"]["uid"]
    assert any(o["uid"] == model_uid for o in owners), owners  # garbage collection still reaches it


def test_wedged_prefill_is_drained_replacement_ready_first_no_healthy_request_fails(env: Env) -> None:
    name = "drain"
    up(env, name, DRAIN, EMULATED_PORT_PREFILL)
    before = set(model_pods(env, name))
    with Load(env, name, concurrency=4) as load:
        load.wait_flowing()
        victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
        victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
        failed_before = len(load.failed)
        wedge(env, name, victim)
        wait_for(
            lambda: (
                model_pods(env, name)[victim_uid]["metadata"]["labels"][contract.LABEL_ROLE]
                == contract.ROLE_QUARANTINED
            ),
            STUCK + 90,
            "the victim quarantined",
            1.0,
            API_TRANSIENT,
        )
        assert_quarantined(env, name, model_pods(env, name)[victim_uid])
        rem = wait_for(
            lambda: [r for r in remediations(env, name, victim_name) if r["outcome"] == "deleted"],
            DRAIN_SECONDS + 60,
            "the drained victim deleted",
            1.0,
            API_TRANSIENT,
        )[0]
        wait_for(lambda: victim_uid not in model_pods(env, name), 120, "the victim gone", 1.0, API_TRANSIENT)
        load.wait_flowing(20)
        failed = load.failed[failed_before:]
        completed = len(load.ok)
    assert rem["action"] == "drain"
    # drained (healthy requests done and the replacement Ready), not cut off by the deadline
    assert phases(rem) == ["pending", "quarantined", "drained", "deleted"], rem
    deleted_at = epoch(rem["phases"][-1]["time"])
    replacements = [p for uid, p in model_pods(env, name).items() if uid not in before]
    assert replacements and all(
        p["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_PREFILL for p in replacements
    )
    # the replacement was Ready before the old pod was deleted (status times are whole seconds)
    assert min(ready_since(p) for p in replacements) <= deleted_at, (replacements, rem)
    # the only request on a stuck room is the race's own; no request of the steady load failed
    assert failed == [] and completed > 0, (len(failed), completed)
    reasons = [e["reason"] for e in env.events(name)]
    for reason in ("WedgedPodQuarantined", "WedgedPodDrained", "DrainedPodDeleted"):
        assert reason in reasons, reasons
    assert_each_pod_acted_on_once(env, name)


def test_a_drain_interrupted_by_the_operators_death_is_finished_by_the_next_operator(env: Env) -> None:
    name = "drainkill"
    first = up(env, name, DRAIN, EMULATED_PORT_PREFILL)
    victim = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
    victim_name, victim_uid = victim["metadata"]["name"], victim["metadata"]["uid"]
    wedge(env, name, victim)
    wait_for(
        lambda: [r for r in remediations(env, name, victim_name) if r["outcome"] == "quarantined"],
        STUCK + 90,
        "the victim quarantined",
        0.2,
        API_TRANSIENT,
    )
    first.kill()
    # killed mid-drain: the pod is quarantined and still there, its remediation still open
    (entry,) = remediations(env, name, victim_name)
    assert entry["outcome"] == "quarantined", entry
    pod = model_pods(env, name)[victim_uid]
    assert not pod["metadata"].get("deletionTimestamp")
    assert_quarantined(env, name, pod)
    env.start_operator()
    rem = wait_for(
        lambda: [r for r in remediations(env, name, victim_name) if r["outcome"] == "deleted"],
        DRAIN_SECONDS + 90,
        "the drain finished by the restarted operator",
        1.0,
        API_TRANSIENT,
    )
    wait_for(lambda: victim_uid not in model_pods(env, name), 120, "the victim gone", 1.0, API_TRANSIENT)
    wait_for(
        lambda: len(env.live_ready_pods(name, contract.ROLE_PREFILL)) == 2,
        240,
        "2 Ready prefill pods",
        1.0,
        API_TRANSIENT,
    )
    assert len(remediations(env, name, victim_name)) == 1  # finished, not repeated
    assert phases(rem[0])[:2] == ["pending", "quarantined"] and phases(rem[0])[-1] == "deleted"
    assert_each_pod_acted_on_once(env, name)
