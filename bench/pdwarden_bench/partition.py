"""A prefill cut off from the decodes' KV while everyone stays alive, on the local cluster.

One model of 2 prefill and 2 decode synthetic pods, NIXL over UCX's TCP transport (so the
KV path is the network, not shared memory), traffic on every prefill-decode pair. A packet
filter in each decode pod's network namespace (nftables) drops everything from prefill P1:
its WRITEs stall (its handles are quarantined at the transfer deadline), the decodes fail
P1's rooms at their inflight deadline and hold the pages P1 may still write, while P2's
requests keep reusing every page the decodes free. Then either

- **heal**: the filter goes away; P1's stalled segments are retransmitted and land, its
  quarantine sees the handles end, it acknowledges the drain and the decodes free the pages;
- **remediate**: the watchdog blames P1 (the decodes point at it: deadlines, held pages) and
  restarts it; once its deletion completed the operator lists it as gone, the decodes read
  the list (a mounted ConfigMap, refreshed by the kubelet) and free the pages.

Measured throughout (every half second): pages a decode freed while P1 still listed the room
as quarantined (must be 0), pages held for P1, corrupted pages decode's verification found
(``pdwarden_kv_verify_failures_total``, over every request until the end; must stay 0), and
how long after P1's deletion the last page held for it was freed.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pdwarden_contract as contract
from pdwarden_bench.polling import Poller
from pdwarden_localcluster.cluster import ports
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_testkit.cluster_env import API_TRANSIENT, Env, Load, http_json, metrics_url, synthetic_model
from pdwarden_testkit.promtext import Sample, metric_sum, samples

INFLIGHT_DEADLINE: Final = 8
TRANSFER_DEADLINE: Final = 3
# Longer than the inflight deadline plus SGLang's 30 s release timeout: a decode that frees
# pages on that clock does so while P1 is still alive and quarantined.
PARTITION_S: Final = 50.0
SCRAPE_INTERVAL: Final = 2
# remediate: the watchdog acts on P1 within the partition, after the old clock would have run.
STUCK_AFTER_REMEDIATE: Final = 40
# heal: the path heals long before the watchdog could act.
STUCK_AFTER_HEAL: Final = 300
PROMPT: Final = "pdwarden partition " * 9  # 171 tokens: 11 pages, 6 chunks
NFT_TABLE: Final = "pdwarden_partition"


def model_body(env: Env, name: str, stuck_after: int) -> dict[str, Any]:
    return synthetic_model(
        env.namespace,
        name,
        replicas=2,
        # a small pool: the other prefill's requests reuse freed pages at once
        decode_args=["--pool-pages", "160", "--aux-slots", "64"],
        transfer={
            "ucxTransports": "tcp,self",
            "inflightDeadlineSeconds": INFLIGHT_DEADLINE,
            "transferDeadlineSeconds": TRANSFER_DEADLINE,
        },
        watchdog={
            "stuckAfterSeconds": stuck_after,
            "scrapeIntervalSeconds": SCRAPE_INTERVAL,
            "action": "restart",
        },
    )


def _nft(netns: str, script: str, check: bool = True) -> None:
    command = ["ip", "netns", "exec", netns, "nft", script]
    subprocess.run(command, check=check, capture_output=True, timeout=30)


@contextlib.contextmanager
def partition(decodes: list[dict[str, Any]], prefill_ip: str) -> Iterator[None]:
    """Drop every packet from ``prefill_ip`` at the decodes (in their pods' network namespaces),
    one nft transaction per decode: the cut lands while the rooms seen in flight still are."""
    net = ports().net
    spaces = [net.pod_netns(p["metadata"]["uid"]) for p in decodes]
    rules = (
        f"add table inet {NFT_TABLE}; "
        f"add chain inet {NFT_TABLE} input {{ type filter hook input priority 0; }}; "
        f"add rule inet {NFT_TABLE} input ip saddr {prefill_ip} drop"
    )
    try:
        for ns in spaces:
            _nft(ns, rules)
        yield
    finally:
        for ns in spaces:
            _nft(ns, f"delete table inet {NFT_TABLE}", check=False)


def pod_samples(pod: dict[str, Any]) -> list[Sample]:
    """Every sample of a runtime pod's /metrics."""
    status, text = http_json(metrics_url(pod), timeout=5)
    if status != 200:
        raise RuntimeError(f"{pod['metadata']['name']} /metrics answered {status}")
    return samples(str(text))


def peer_figures(pod: dict[str, Any], ip: str) -> dict[str, float]:
    """What ``pod`` exports about its peer ``ip``: rooms in flight, pages held, outcomes."""
    found = pod_samples(pod)
    figures = {
        "inflight": metric_sum(found, contract.METRIC_KV_PEER_INFLIGHT, peer=ip),
        "pages_held": metric_sum(found, contract.METRIC_KV_PAGES_HELD, peer=ip),
    }
    for outcome in contract.OUTCOMES:
        figures[outcome] = metric_sum(
            found, contract.METRIC_KV_PEER_TRANSFERS_TOTAL, peer=ip, outcome=outcome
        )
    return figures


def _every_decode_moving_with(decodes: list[dict[str, Any]], ip: str) -> None:
    """Until every decode has a room in flight with the prefill at ``ip``: a cut then catches
    each of them mid-transfer, so each holds pages for it (and points at it). A decode with no
    room of it at the cut could only point at it through the rooms that come later."""
    wait_for(
        lambda: all(peer_figures(d, ip)["inflight"] > 0 for d in decodes),
        120,
        f"every decode moving KV with {ip}",
        0.1,
        API_TRANSIENT,
    )


def _state(pod: dict[str, Any]) -> dict[str, Any] | None:
    url = f"http://{pod['status']['podIP']}:{contract.DEFAULT_HTTP_PORT}/debug/state"
    with contextlib.suppress(Exception):
        status, body = http_json(url, timeout=5)
        if status == 200 and isinstance(body, dict):
            return body
    return None


@dataclass
class HeldWatch(Poller):
    """Polls the decodes and the cut-off prefill: pages freed under a quarantined write, pages
    held for it, and when the last of them went."""

    decodes: list[dict[str, Any]]
    prefill: dict[str, Any]
    freed_while_quarantined: int = 0  # pages
    held_pages_max: int = 0
    freed: list[dict[str, Any]] = field(default_factory=list)  # rooms held for the prefill, freed
    last_held_at: float | None = None  # monotonic: the last poll that saw a page held for it
    _seen: set[tuple[str, int]] = field(default_factory=set)
    interval = 0.5

    @property
    def ip(self) -> str:
        return str(self.prefill["status"]["podIP"])

    def poll(self) -> None:
        p_state = _state(self.prefill)
        quarantined = set((p_state or {}).get("quarantined_rooms") or [])
        held = 0
        for pod in self.decodes:
            state = _state(pod)
            if state is None:
                continue
            held += sum(h["pages"] for h in state.get("held_rooms", []) if h["peer"] == self.ip)
            for f in state.get("freed_held_rooms", []):
                key = (pod["metadata"]["name"], int(f["room"]))
                if f["peer"] != self.ip or key in self._seen:
                    continue
                self._seen.add(key)
                self.freed.append({**f, "decode": key[0], "at": time.monotonic()})
                if int(f["room"]) in quarantined:  # still quarantined on the prefill: unsafe
                    self.freed_while_quarantined += int(f.get("pages", 1))
        self.held_pages_max = max(self.held_pages_max, held)
        if held:
            self.last_held_at = time.monotonic()


def corrupted_pages(pods: list[dict[str, Any]]) -> float:
    total = 0.0
    for pod in pods:
        total += metric_sum(pod_samples(pod), contract.METRIC_KV_VERIFY_FAILURES_TOTAL)
    return total


@dataclass
class PartitionResult:
    mode: str
    decode_pages_freed_while_quarantined: int
    corrupted_pages: float
    held_pages_max: int
    freed_how: dict[str, int]
    pages_freed_after_remediation_seconds: float | None = None
    pages_freed_after_heal_seconds: float | None = None
    requests_ok: int = 0
    requests_failed: int = 0


def run(env: Env, name: str, mode: str, say: Any = lambda _m: None) -> PartitionResult:
    """One partition scenario (``heal`` or ``remediate``) on a new model ``name``; the
    operator must be running in ``env``'s namespace."""
    if mode not in ("heal", "remediate"):
        raise ValueError(f"mode must be heal or remediate, not {mode!r}")
    stuck = STUCK_AFTER_REMEDIATE if mode == "remediate" else STUCK_AFTER_HEAL
    env.create_model(model_body(env, name, stuck))
    wait_for(
        lambda: all(len(env.live_ready_pods(name, r)) == 2 for r in contract.RUNTIME_ROLES),
        300,
        f"2 ready prefill and 2 ready decode pods of {name}",
        1.0,
        API_TRANSIENT,
    )
    prefill = env.live_ready_pods(name, contract.ROLE_PREFILL)[0]
    decodes = env.live_ready_pods(name, contract.ROLE_DECODE)
    with Load(env, name, concurrency=6, prompt=PROMPT) as load, HeldWatch(decodes, prefill) as watch:
        load.wait_flowing(12, timeout=180)
        time.sleep(3)  # the decodes' writer watch has asked every prefill who it is
        _every_decode_moving_with(decodes, watch.ip)
        say(f"{mode}: cutting {prefill['metadata']['name']} ({watch.ip}) off both decodes")
        gone_at: float | None = None
        with partition(decodes, watch.ip):
            started = time.monotonic()
            if mode == "heal":
                time.sleep(PARTITION_S)
            else:
                gone_at = _wait_remediated(env, name, prefill, decodes)
            held_at_end = watch.held_pages_max
        healed = time.monotonic()
        say(f"{mode}: path restored after {healed - started:.0f}s ({held_at_end} pages held at most)")

        def all_freed() -> bool:
            watch.poll()
            return watch.last_held_at is not None and not _held_now(decodes, watch.ip)

        wait_for(all_freed, 240, f"every page held for {watch.ip} freed", 1.0)
        freed_at = time.monotonic()
        load.wait_flowing(12, timeout=120)  # later requests verify every page
        time.sleep(5)
    live_decodes = env.live_ready_pods(name, contract.ROLE_DECODE)
    return PartitionResult(
        mode=mode,
        decode_pages_freed_while_quarantined=watch.freed_while_quarantined,
        corrupted_pages=corrupted_pages(live_decodes),
        held_pages_max=watch.held_pages_max,
        freed_how=_count(f["how"] for f in watch.freed),
        pages_freed_after_remediation_seconds=None if gone_at is None else round(freed_at - gone_at, 1),
        pages_freed_after_heal_seconds=round(freed_at - healed, 1) if mode == "heal" else None,
        requests_ok=len(load.ok),
        requests_failed=len(load.failed),
    )


def _held_now(decodes: list[dict[str, Any]], ip: str) -> bool:
    for pod in decodes:
        state = _state(pod)
        if state is None or any(h["peer"] == ip for h in state.get("held_rooms", [])):
            return True
    return False


def _wait_remediated(env: Env, name: str, prefill: dict[str, Any], decodes: list[dict[str, Any]]) -> float:
    """Until the watchdog restarted the cut-off prefill and its deletion completed; when. On a
    timeout the error carries what the decodes export about the prefill and the model's
    watchdog status: the evidence the watchdog judged."""
    uid = prefill["metadata"]["uid"]

    def gone() -> bool:
        pods = env.call("GET", f"/api/v1/namespaces/{env.namespace}/pods")["items"]
        return all(p["metadata"]["uid"] != uid for p in pods)

    try:
        wait_for(gone, 240, f"{prefill['metadata']['name']} remediated and gone", 1.0, API_TRANSIENT)
    except WaitTimeout as exc:
        ip = str(prefill["status"]["podIP"])
        seen: dict[str, Any] = {}
        for d in decodes:
            try:
                seen[d["metadata"]["name"]] = peer_figures(d, ip)
            except Exception as err:  # the figures are for the message only
                seen[d["metadata"]["name"]] = repr(err)
        try:
            status = env.dm(name).get("status", {})
        except Exception as err:
            status = repr(err)
        raise WaitTimeout(f"{exc}; the decodes about {ip}: {seen}; the model's status: {status}") from exc
    return time.monotonic()


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out
