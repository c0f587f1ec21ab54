"""The emulated port's race through SGLang's real NIXL classes, in a child spawned like its scheduler.

The test process sets the launcher's environment (``seam_env``) and starts a child with
``multiprocessing``'s ``spawn`` context, as SGLang starts its scheduler; in the child the
hardening is whatever ``sitecustomize`` installed at start-up, nothing else. The child gets
its KV classes from ``get_kv_class(TransferBackend.NIXL, ...)`` like SGLang's prefill and
decode code, on CPU tensors (NIXL over UCX, DRAM), and replays the race: a non-last chunk
lands, its Transferring write is held (fault ``emulated-maxstatus-port-race``), decode's ABORT makes
the room Failed and drops its transfer info, the held write comes, then the last chunk.

Hardened, the room ends Failed on both sides and the resurrecting write is refused and
counted. The control run (`emulated-port`: the emulated NIXL port with the old max() rule,
same seam) shows the wedge the test guards against.
SGLang's runtime-context getters are replaced in the child (no model, no GPU).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import types
from multiprocessing.connection import Connection
from typing import Any

import pytest

import pdwarden_contract as contract
from pdwarden_localcluster.waits import WaitTimeout, wait_for
from pdwarden_runtime.sglang_boot import seam_env
from pdwarden_testkit.ports import free_port

pytestmark = pytest.mark.integration

CHILD_TIMEOUT_S = 600  # generous: importing SGLang on a loaded 2-core machine is slow
N_PAGES = 64
ITEM = 4096
LAYERS = 2
AUX_ITEM = 64


def _patch_runtime_context(boot_port: int) -> None:
    import sglang.srt.disaggregation.common.conn as cconn
    import sglang.srt.disaggregation.nixl.conn as nconn

    ns = types.SimpleNamespace
    values = dict(
        get_parallel=ns(
            dist_init_addr=None,
            dp_size=1,
            enable_cp_tp_group_sharing=False,
            enable_dsa_cache_layer_split=False,
            enable_kv_cache_sharding=False,
            load_balance_method="round_robin",
            nnodes=1,
            num_dp_ranks=1,
            pp_group=None,
            pp_size=1,
            world_group=None,
            attn_cp_rank=0,
            attn_cp_size=1,
            attn_dcp_rank=0,
            attn_dcp_size=1,
            attn_dp_rank=0,
            attn_dp_size=1,
            attn_tp_rank=0,
            attn_tp_size=1,
        ),
        get_serving=ns(host="127.0.0.1", port=30000),
        get_disagg=ns(
            disaggregation_bootstrap_port=boot_port, disaggregation_decode_allocation_policy="early"
        ),
        get_device=ns(device="cpu"),
        get_schedule=ns(chunked_prefill_size=8192, max_prefill_tokens=16384),
        get_observability=ns(enable_trace=False),
    )
    for module in (cconn, nconn):
        for name, value in values.items():
            if hasattr(module, name):
                setattr(module, name, lambda v=value: v)
    cconn.linear_attn_tp_size = lambda: 1


def _kv_args(kv_args_class: Any, fill: int) -> tuple[Any, list[Any], Any]:
    import torch

    bufs = [torch.full((N_PAGES * 2 * ITEM,), fill, dtype=torch.uint8) for _ in range(2 * LAYERS)]
    aux = torch.zeros(16 * AUX_ITEM, dtype=torch.uint8)
    a = kv_args_class()
    a.engine_rank = 0
    a.kv_data_ptrs = [b.data_ptr() for b in bufs]
    a.kv_data_lens = [b.numel() for b in bufs]
    a.kv_item_lens = [ITEM] * len(bufs)
    a.kv_layer_ids = [i % LAYERS for i in range(len(bufs))]
    a.kv_cache_dtype_str = "bfloat16"
    a.kv_data_mem_kinds = ["DRAM"] * len(bufs)
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = [aux.data_ptr()], [aux.numel()], [AUX_ITEM]
    a.state_types, a.state_data_ptrs, a.state_data_lens = [], [], []
    a.state_item_lens, a.state_layer_ids, a.state_dim_per_tensor = [], [], []
    a.ib_device, a.gpu_id, a.page_size, a.system_dp_rank = None, 0, 1, 0
    a.pp_rank, a.prefill_start_layer, a.prefill_end_layer = 0, 0, None
    a.rust_http_port = None
    return a, bufs, aux


def _wait_for(pred: Any, timeout: float) -> bool:
    """Whether `pred` came true within `timeout` (the child reports either outcome)."""
    try:
        wait_for(pred, timeout, "a condition of the race", 0.01, ())
    except WaitTimeout:
        return False
    return True


def race_in_scheduler_like_child(boot_port: int, settle_s: float, writer: Connection) -> None:
    """Runs in the spawned child; sends back what happened."""
    try:
        writer.send(_race(boot_port, settle_s))
    except BaseException as err:
        import traceback

        writer.send({"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
    finally:
        writer.close()
        os._exit(0)  # NIXL/UCX threads must not keep the child alive


def _race(boot_port: int, settle_s: float) -> dict[str, Any]:
    import numpy as np
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.utils import (
        DisaggregationMode,
        KVClassType,
        TransferBackend,
        get_kv_class,
    )

    from pdwarden_runtime import hardening
    from pdwarden_runtime.kvpoll import KVPoll as PdwKVPoll
    from pdwarden_runtime.sglang_boot.activate import STATE

    _patch_runtime_context(boot_port)
    nixl = TransferBackend.NIXL
    manager_class = get_kv_class(nixl, KVClassType.MANAGER)
    boot = get_kv_class(nixl, KVClassType.BOOTSTRAP_SERVER)(host="127.0.0.1", port=boot_port)
    kv_args_class = get_kv_class(nixl, KVClassType.KVARGS)
    p_args, _p_bufs, _ = _kv_args(kv_args_class, 7)
    d_args, _d_bufs, _ = _kv_args(kv_args_class, 0)
    prefill = manager_class(p_args, DisaggregationMode.PREFILL, None, False)
    decode = manager_class(d_args, DisaggregationMode.DECODE, None, False)
    addr = f"127.0.0.1:{boot_port}"
    if not _wait_for(lambda: decode.try_ensure_parallel_info(addr), 120):
        raise RuntimeError("decode never saw prefill's parallel info")

    room = 4242
    receiver = get_kv_class(nixl, KVClassType.RECEIVER)(decode, addr, room)
    receiver.init(prefill_dp_rank=0)
    sender = get_kv_class(nixl, KVClassType.SENDER)(prefill, addr, room)
    receiver.send_metadata(np.arange(N_PAGES, 2 * N_PAGES, dtype=np.int32), aux_index=1)
    if not _wait_for(lambda: sender.poll() != KVPoll.Bootstrapping, 120):
        raise RuntimeError("prefill room never left Bootstrapping")
    sender.init(N_PAGES, aux_index=2)
    src = np.arange(0, N_PAGES, dtype=np.int32)
    half = N_PAGES // 2

    def landed() -> float:
        return (
            prefill.pdwarden.metrics.registry.get_sample_value(
                "pdwarden_kv_transfer_bytes_total", {"role": "prefill"}
            )
            or 0.0
        )

    sender.send(src[:half])  # the non-last chunk: lands, its Transferring write is held
    chunk_landed = _wait_for(lambda: landed() > 0, 120)
    receiver.abort()  # decode's ABORT: prefill marks Failed and drops the transfer info
    time.sleep(0.5)  # the held write (Transferring) comes now, or at the race window's end
    sender.send(src[half:])  # the last chunk: its room has no transfer info any more
    ended = _wait_for(lambda: sender.poll() in (KVPoll.Failed, KVPoll.Success), settle_s)
    refused = prefill.pdwarden.metrics.registry.get_sample_value(
        "pdwarden_kv_status_writes_refused_total",
        {"role": "prefill", "from_state": "failed", "to_state": "transferring"},
    )
    result = {
        "seam": dict(STATE, traceback=None),
        "fixes": hardening.active_fixes(),
        "classes": [type(o).__qualname__ for o in (prefill, decode, sender, receiver, boot)],
        "chunk_landed": chunk_landed,
        "ended": ended,
        "prefill": PdwKVPoll(int(sender.poll())).name,
        "decode": PdwKVPoll(int(receiver.poll())).name,
        "refused_failed_to_transferring": refused,
        "prefill_inflight": prefill.pdwarden.tracker.count(),
        "side_key": hardening.installed_config().side_keys.required,
        "side_channel_errors": [
            mgr.pdwarden.metrics.registry.get_sample_value(
                "pdwarden_runtime_errors_total", {"role": role, "where": "side_channel"}
            )
            for mgr, role in ((prefill, "prefill"), (decode, "decode"))
        ],
    }
    return result


def run_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, config: dict[str, Any], boot_port: int, settle_s: float
) -> dict:
    env = seam_env(os.environ, config, prom_dir=str(tmp_path), on_error="record")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    ctx = mp.get_context("spawn")  # SGLang: mp.set_start_method("spawn"), then mp.Process
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=race_in_scheduler_like_child, args=(boot_port, settle_s, writer))
    proc.start()
    writer.close()
    try:
        assert reader.poll(CHILD_TIMEOUT_S), "the spawned child did not report in time"
        result: dict = reader.recv()
    finally:
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
    assert "error" not in result, result.get("traceback")
    return result


def test_hardened_sglang_nixl_race_ends_failed(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    config = {"engine": "sglang", "fault": contract.FAULT_EMULATED_PORT_RACE, "race_window": 5}
    # up to 120 s for the room to conclude (returns as soon as it does)
    r = run_child(monkeypatch, tmp_path, config, free_port(), settle_s=120)
    assert r["seam"]["activated"] is True
    assert all(r["fixes"].values()), r["fixes"]
    assert r["classes"] == [
        "HardenedNixlKVManager",
        "HardenedNixlKVManager",
        "HardenedNixlKVSender",
        "HardenedNixlKVReceiver",
        "HardenedNixlKVBootstrapServer",
    ]
    assert r["chunk_landed"]
    assert (r["prefill"], r["decode"]) == ("Failed", "Failed")
    assert r["refused_failed_to_transferring"] >= 1  # the resurrection, caught
    assert r["prefill_inflight"] == 0


def test_with_the_worker_key_the_race_runs_on_a_signed_side_channel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The launcher hands SGLang's processes the key file: the rank registers with a signed PUT,
    the decode reads the rank with the proof and every ZMQ message carries one; none dropped."""
    key_file = tmp_path / "worker-key"
    key_file.write_text("k" * 43 + "\n")
    config = {
        "engine": "sglang",
        "fault": contract.FAULT_EMULATED_PORT_RACE,
        "race_window": 5,
        "worker_key_file": str(key_file),
    }
    r = run_child(monkeypatch, tmp_path, config, free_port(), settle_s=120)
    assert r["seam"]["activated"] is True and r["side_key"] is True
    assert r["chunk_landed"]
    assert (r["prefill"], r["decode"]) == ("Failed", "Failed")
    assert r["side_channel_errors"] == [0.0, 0.0]


def test_control_without_hardening_wedges(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Same seam, fixes off: the prefill room is stuck in Transferring (the emulated port's bug)."""
    config = {
        "engine": "sglang",
        "fault": contract.FAULT_EMULATED_PORT_RACE,
        "race_window": 5,
        "hardening": "emulated-port",
    }
    # 15 s: well past the 5 s race window; a wedged room never concludes
    r = run_child(monkeypatch, tmp_path, config, free_port(), settle_s=15)
    assert r["seam"]["activated"] is True
    assert r["fixes"]["sticky_status"] is False
    assert r["chunk_landed"]
    assert r["ended"] is False and r["prefill"] == "Transferring"
    assert r["prefill_inflight"] == 1
