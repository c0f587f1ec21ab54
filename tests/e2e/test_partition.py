"""A prefill cut off from the decodes' KV, everyone alive: decode never frees a page that
prefill may still write (the harness: ``pdwarden_bench.partition``).

Two scenarios on the local cluster, side by side under one operator, each a model of 2
prefill and 2 decode synthetic pods under traffic on every pair, one prefill's packets dropped
at both decodes (nftables in their pods' network namespaces) for longer than SGLang's 30 s
release timeout: the path heals (the prefill's writes land, it drains, the pages go), or the
watchdog restarts the prefill (its deletion is the proof, the pages go). In both, no page goes
while the prefill still has quarantined handles for its room, and decode's verification finds
no corrupted page in any request until the end.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

import pdwarden_contract as contract
from pdwarden_bench import partition
from pdwarden_testkit.cluster_env import Env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HEAL, REMEDIATE = "cut-heal", "cut-fix"


def test_held_pages_go_only_on_a_drain_after_the_heal_or_the_writers_deletion(env: Env) -> None:
    """Both scenarios at once, under one operator (their waits overlap; each model's pods and
    packet filters are its own)."""
    env.start_operator()
    with ThreadPoolExecutor(max_workers=2) as pool:
        healing = pool.submit(partition.run, env, HEAL, "heal")
        remediating = pool.submit(partition.run, env, REMEDIATE, "remediate")
        healed, remediated = healing.result(), remediating.result()
    _a_healed_partition_lands_late_writes_in_held_pages_only(env, healed)
    _a_remediated_writer_frees_the_pages_it_held_hostage(env, remediated)


def _a_healed_partition_lands_late_writes_in_held_pages_only(
    env: Env, result: partition.PartitionResult
) -> None:
    assert result.held_pages_max > 0, result  # the partition did strand rooms on the decodes
    assert result.decode_pages_freed_while_quarantined == 0, result
    assert result.corrupted_pages == 0, result
    assert result.freed_how.get("drained", 0) > 0 and set(result.freed_how) == {"drained"}, result
    status = env.dm(HEAL).get("status") or {}
    assert status["watchdog"]["lastScrape"], status  # the watchdog ran its rounds meanwhile
    assert status.get("remediations") in (None, []), status.get("remediations")


def _a_remediated_writer_frees_the_pages_it_held_hostage(env: Env, result: partition.PartitionResult) -> None:
    assert result.held_pages_max > 0, result
    assert result.decode_pages_freed_while_quarantined == 0, result
    assert result.corrupted_pages == 0, result
    assert result.freed_how.get("pod-deleted", 0) > 0, result
    assert result.pages_freed_after_remediation_seconds is not None
    remediations = (env.dm(REMEDIATE).get("status") or {}).get("remediations") or []
    remediated = [r for r in remediations if r["role"] == contract.ROLE_PREFILL]
    assert remediated and "pair-aware blame" in remediated[0]["reason"], remediated
    assert all(r["role"] == contract.ROLE_PREFILL for r in remediations), remediations
