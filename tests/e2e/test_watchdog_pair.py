"""Pair-aware blame end to end: local cluster, real operator process, 2 prefill + 2 decode
synthetic pods under steady traffic, the decode-side transfer stall injected into ONE decode.

Both prefill pods see their rooms with that decode end at the transfer deadline (real NIXL
WRITEs into an agent that never progresses) while the decode still answers HTTP; the
watchdog must blame the decode, restart it, touch no prefill pod, and traffic must recover.
The harness is testkit/pdwarden_testkit/cluster_env.py.
"""

from __future__ import annotations

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import wait_for
from pdwarden_testkit.cluster_env import (
    API_TRANSIENT,
    CHARGED,
    STUCK,
    WATCHDOG,
    Env,
    Load,
    inject,
    remediations,
    up,
    with_outcome,
)

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(900)
def test_decode_side_stall_blames_the_decode_and_no_prefill_is_touched(env: Env) -> None:
    name = "pair"
    up(env, name, WATCHDOG)
    prefill_uids = {p["metadata"]["uid"] for p in env.live_ready_pods(name, contract.ROLE_PREFILL)}
    with Load(env, name, concurrency=8) as load:
        load.wait_flowing()
        victim = env.live_ready_pods(name, contract.ROLE_DECODE)[0]
        victim_name = victim["metadata"]["name"]
        inject(victim, contract.FAULT_STALL_KV_RECEIVE)
        rem = wait_for(
            lambda: with_outcome(env, name, victim_name, "deleted"),
            STUCK + 150,
            "the stalled decode's remediation",
            1.0,
            API_TRANSIENT,
        )[0]
        assert rem["role"] == "decode" and rem["action"] == "restart"
        assert "pair-aware blame" in rem["reason"]
        for prefill in env.pods(name, contract.ROLE_PREFILL):  # both sides named in the entry
            assert prefill["metadata"]["name"] in rem["reason"], rem["reason"]
        wait_for(
            lambda: victim_name not in [p["metadata"]["name"] for p in env.pods(name, contract.ROLE_DECODE)],
            120,
            "the stalled decode to be gone",
            1.0,
            API_TRANSIENT,
        )
        wait_for(
            lambda: len(env.live_ready_pods(name, contract.ROLE_DECODE)) == 2,
            240,
            "a replacement decode pod Ready",
            1.0,
            API_TRANSIENT,
        )
        load.wait_flowing(20)
    # Only the decode was acted on. Once it is gone, rooms the prefills had opened for it wait
    # for their clients' timeouts and the wedge rule may find a prefill stalled meanwhile: the
    # model-wide cooldown defers that (recorded, never performed), and the prefill recovers.
    acted = [r for r in remediations(env, name) if r["outcome"] in CHARGED]
    assert [r["pod"] for r in acted] == [victim_name], acted
    assert {p["metadata"]["uid"] for p in env.pods(name, contract.ROLE_PREFILL)} == prefill_uids
    events = [e for e in env.events(victim_name) if e["reason"] == "WedgedPodRestarted"]
    assert events and "pair-aware blame" in events[0]["message"]
