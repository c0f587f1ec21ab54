"""A prefill cut off from the decodes' KV, everyone alive: decode never frees a page that
prefill may still write (the harness: ``pdwarden_bench.partition``).

Two scenarios on the local cluster, each a model of 2 prefill and 2 decode synthetic pods
under traffic on every pair, one prefill's packets dropped at both decodes (nftables in their
pods' network namespaces) for longer than SGLang's 30 s release timeout: the path heals
(the prefill's writes land, it drains, the pages go), or the watchdog restarts the prefill
(its deletion is the proof, the pages go). In both, no page goes while the prefill still has
quarantined handles for its room, and decode's verification finds no corrupted page in any
request until the end.
"""

from __future__ import annotations

import pytest

from pdwarden_bench import partition
from pdwarden_bench.cluster_env import Env
from pdwarden_runtime import contract

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_healed_partition_lands_late_writes_in_held_pages_only(env: Env) -> None:
    env.start_operator()
    result = partition.run(env, "cut-heal", "heal")
    assert result.held_pages_max > 0, result  # the partition did strand rooms on the decodes
    assert result.decode_pages_freed_while_quarantined == 0, result
    assert result.corrupted_pages == 0, result
    assert result.freed_how.get("drained", 0) > 0 and set(result.freed_how) == {"drained"}, result
    status = env.dm("cut-heal").get("status") or {}
    assert status["watchdog"]["lastScrape"], status  # the watchdog ran its rounds meanwhile
    assert status.get("remediations") in (None, []), status.get("remediations")


def test_a_remediated_writer_frees_the_pages_it_held_hostage(env: Env) -> None:
    env.start_operator()
    result = partition.run(env, "cut-fix", "remediate")
    assert result.held_pages_max > 0, result
    assert result.decode_pages_freed_while_quarantined == 0, result
    assert result.corrupted_pages == 0, result
    assert result.freed_how.get("pod-deleted", 0) > 0, result
    assert result.pages_freed_after_remediation_seconds is not None
    remediated = [
        r for r in (env.dm("cut-fix").get("status") or {}).get("remediations") or [] if r["role"] == "prefill"
    ]
    assert remediated and "pair-aware blame" in remediated[0]["reason"], remediated
    assert all(r["role"] == contract.ROLE_PREFILL for r in (env.dm("cut-fix")["status"]["remediations"]))
