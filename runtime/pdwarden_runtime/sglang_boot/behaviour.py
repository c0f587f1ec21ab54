"""The doctor's behavioural checks, run inside the spawned scheduler-like child.

Presence of the hardened classes is not proof they work: here a loopback prefill/decode
pair is built on SGLang's real NIXL classes with the hardening installed (CPU memory,
NIXL over UCX) and the behaviours that matter are exercised:

- ``sticky_failed``: a non-terminal status write to a Failed room is refused (counted);
- ``stalled_handle_no_ack``: a handle that stays unsettled (the stall fault) fails the
  room at the transfer deadline, is quarantined, and decode is NOT told its pages are
  free until the handle settles; then it is;
- ``signatures``: every SGLang method pdwarden overrides still has the parameters of the
  pinned upstream 0.5.23 (a drift means an override may no longer be called as SGLang
  calls it).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any, Final

# (class, method) -> parameters of SGLang 0.5.23's method: name, "*" keyword-only, "=" default.
PINNED_SIGNATURES: Final = {
    ("NixlKVManager", "update_status"): "self bootstrap_room status",
    ("NixlKVManager", "send_kv_status_message"): "self targets* bootstrap_room* status* failure_reason*=",
    ("NixlKVManager", "transfer_worker"): "self queue staging_buffer= worker_index=",
    ("NixlKVManager", "_await_handles"): "self handles failure_seen*",
    ("NixlKVManager", "record_failure"): "self bootstrap_room failure_reason",
    ("NixlKVManager", "poison_deferred_ack_room"): "self room",
    ("NixlKVManager", "_maybe_ack_drained_abort"): "self room",
    ("NixlKVManager", "check_status"): "self bootstrap_room",
    ("NixlKVManager", "_handle_abort_notification"): "self msg",
    ("NixlKVManager", "add_transfer_request"): (
        "self bootstrap_room kv_indices index_slice is_last_chunk aux_index= state_indices= "
        "num_kv_tokens= wait_event*= indices_event*= trace_ctx*="
    ),
    ("NixlKVManager", "build_receiver_registration_message"): "self",
    ("NixlKVManager", "build_receiver_metadata_message"): (
        "self bootstrap_room* required_dst_info_num* kv_indices* aux_index* state_indices* "
        "decode_prefix_len* is_dummy* device_kv_indices*="
    ),
    ("NixlKVManager", "register_deferred_abort_room"): "self bootstrap_room",
    ("NixlKVManager", "clear_deferred_abort_state"): "self bootstrap_room",
    ("NixlKVManager", "is_abort_release_safe"): "self bootstrap_room required_acks",
    ("NixlKVManager", "_send_multipart_locked"): "self endpoint parts is_ipv6=",
    ("NixlKVManager", "_register_topology_row"): "self url payload",
    ("NixlKVManager", "_add_remote_peer"): "self decode_kv_args",
    # called, not overridden: a prefill restarted in place is forgotten as a lost one
    ("NixlKVManager", "_handle_node_failure"): "self failed_bootstrap_addr",
    ("NixlKVSender", "clear"): "self",
    ("NixlKVReceiver", "init"): "self prefill_dp_rank",
    ("NixlKVReceiver", "send_metadata"): (
        "self kv_indices aux_index= state_indices= decode_prefix_len= destination= device_kv_indices="
    ),
    ("NixlKVReceiver", "clear"): "self",
    ("NixlKVReceiver", "poll"): "self",
    ("NixlKVReceiver", "_connect"): "endpoint is_ipv6=",  # a classmethod: bound, no cls
    ("NixlKVReceiver", "_get_bootstrap_info_from_server"): (
        "self prefill_dp_rank prefill_cp_rank target_tp_rank target_pp_rank"
    ),
    ("NixlKVBootstrapServer", "__init__"): "self host port",
    ("NixlKVBootstrapServer", "_setup_routes"): "self",
    ("NixlKVBootstrapServer", "_handle_route"): "self request",
}
CHECK_DEADLINE_S: Final = 0.5


def shape(fn: Callable[..., Any]) -> str:
    out = []
    for p in inspect.signature(fn).parameters.values():
        keyword = "*" if p.kind is p.KEYWORD_ONLY else ""
        out.append(p.name + keyword + ("=" if p.default is not p.empty else ""))
    return " ".join(out)


def check_signatures() -> dict[str, Any]:
    from sglang.srt.disaggregation.nixl import conn

    from pdwarden_runtime.hardening.nixl import HARDENED_CLASSES

    drift = []
    for (cls_name, method), pinned in PINNED_SIGNATURES.items():
        upstream = shape(getattr(getattr(conn, cls_name), method))
        if upstream != pinned:
            drift.append(f"{cls_name}.{method}: upstream ({upstream}) != pinned ({pinned})")
    for cls_name, hardened in HARDENED_CLASSES.items():
        upstream_cls = getattr(conn, cls_name)
        for method, fn in vars(hardened).items():
            if (
                callable(fn)
                and not method.startswith("__")
                and hasattr(upstream_cls, method)
                and (cls_name, method) not in PINNED_SIGNATURES
            ):
                drift.append(f"{cls_name}.{method} is overridden but has no pinned signature")
    return {"ok": not drift, "checked": len(PINNED_SIGNATURES), "problems": drift}


def behaviour_checks(free_port: Callable[[], int]) -> dict[str, Any]:
    """Run the checks; never raises (an error is a failed check with its message)."""
    from pdwarden_runtime.hardening.config import ALL_FIXES, FaultSwitch, installed_config

    report: dict[str, Any] = {"signatures": _guarded(check_signatures)}
    config = dataclasses.replace(
        installed_config(),
        transfer_deadline=CHECK_DEADLINE_S,
        fault=FaultSwitch(),
        metrics_port=None,
        stock_classes=False,
        fixes=ALL_FIXES,
        inflight_deadline=None,
    )
    try:
        from pdwarden_runtime.transfer.loopback_pair import Pair

        pair = Pair(free_port(), config)
    except Exception as err:
        report["pair"] = {"ok": False, "problems": [f"{type(err).__name__}: {err}"]}
        return report
    report["sticky_failed"] = _guarded(lambda: _sticky_failed(pair))
    report["stalled_handle_no_ack"] = _guarded(lambda: _stalled_no_ack(pair))
    report["held_pages_need_proof"] = _guarded(lambda: _held_pages_need_proof(pair))
    return report


def _guarded(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return check()
    except Exception as err:
        return {"ok": False, "problems": [f"{type(err).__name__}: {err}"]}


def _sticky_failed(pair: Any) -> dict[str, Any]:
    from pdwarden_runtime.kvpoll import KVPoll

    room = 910001
    mgr = pair.prefill
    mgr.update_status(room, KVPoll.Bootstrapping)
    mgr.update_status(room, KVPoll.Failed)
    mgr.update_status(room, KVPoll.Transferring)
    final = KVPoll(mgr.check_status(room))
    refused = mgr.pdwarden.table.refused().get((KVPoll.Failed, KVPoll.Transferring), 0)
    mgr.request_status.pop(room, None)
    ok = final is KVPoll.Failed and refused >= 1
    return {
        "ok": ok,
        "final": final.name,
        "refused": refused,
        "problems": [] if ok else [f"Failed -> Transferring was not refused (room ended {final.name})"],
    }


def _stalled_no_ack(pair: Any) -> dict[str, Any]:
    from pdwarden_contract import FAULT_STALL
    from pdwarden_runtime.kvpoll import KVPoll
    from pdwarden_runtime.transfer.loopback_pair import poll_until

    room = 910002
    pair.config.fault.set(FAULT_STALL)
    try:
        sender, recv, _dst = pair.open_room(room, 4)
        src = pair.p_pool.take_pages(4)
        sender.send(src)
        failed = poll_until(lambda: int(sender.poll()) == KVPoll.Failed, CHECK_DEADLINE_S + 10)
        quarantined = pair.prefill.pdwarden.quarantined_handles()
        told_early = poll_until(lambda: int(recv.poll()) in (KVPoll.Failed, KVPoll.Success), 0.5)
    finally:
        pair.config.fault.set("none")
    told_after = poll_until(lambda: int(recv.poll()) == KVPoll.Failed, 10)
    problems = []
    if not failed:
        problems.append("the stalled room did not fail at the transfer deadline")
    if quarantined < 1:
        problems.append("the stalled handle was not quarantined")
    if told_early:
        problems.append("decode was told its pages are free while the handle could still write")
    if not told_after:
        problems.append("decode was never told after the quarantined handle settled")
    return {
        "ok": not problems,
        "room_failed": failed,
        "quarantined": quarantined,
        "decode_told_while_quarantined": told_early,
        "decode_told_after": told_after,
        "problems": problems,
    }


def _held_pages_need_proof(pair: Any) -> dict[str, Any]:
    """Decode aborts a room whose writes stalled (their handles quarantined on prefill): its
    pages are held, and SGLang's release decision says not yet, until the prefill drains;
    and SGLang's own "release anyway" timeout is out of reach in this process."""
    import time

    from sglang.srt.environ import envs

    from pdwarden_contract import FAULT_STALL
    from pdwarden_runtime.kvpoll import KVPoll
    from pdwarden_runtime.sglang_boot import NEVER_S
    from pdwarden_runtime.transfer.loopback_pair import poll_until

    room = 910003
    decode = pair.decode
    timeout = float(envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT.get())
    pair.config.fault.set(FAULT_STALL)
    try:
        sender, recv, dst = pair.open_room(room, 4)
        src = pair.p_pool.take_pages(4)
        sender.send(src)
        failed = poll_until(lambda: int(sender.poll()) == KVPoll.Failed, CHECK_DEADLINE_S + 10)
        recv.abort()  # its client left: decode holds the pages for the stalled writer
        held = decode.pdwarden.held_pages.is_held(room)
        time.sleep(1.0)
        freed_early = bool(decode.is_abort_release_safe(room, 1))
    finally:
        pair.config.fault.set("none")
    freed_after = poll_until(lambda: bool(decode.is_abort_release_safe(room, 1)), 10)
    decode.clear_deferred_abort_state(room)
    recv.clear()
    pair.d_pool.give_pages(dst)
    pair.p_pool.give_pages(src)
    problems = []
    if timeout < float(NEVER_S):
        problems.append(f"SGLang's deferred KV release timeout is {timeout:g}s: pages would go on a clock")
    if not failed:
        problems.append("the stalled room did not fail at the transfer deadline")
    if not held:
        problems.append("the aborted room's pages were not held")
    if freed_early:
        problems.append("the pages were released while the writer's handle was quarantined")
    if not freed_after:
        problems.append("the pages were not released once the writer drained")
    return {
        "ok": not problems,
        "release_timeout_s": timeout,
        "held": held,
        "released_while_quarantined": freed_early,
        "released_after_drain": freed_after,
        "problems": problems,
    }
