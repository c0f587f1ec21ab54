"""The doctor's probe: a process tree started the way SGLang starts its own.

Run as ``python -m pdwarden_runtime.sglang_boot.probe`` in the environment the launcher
gives SGLang (``seam_env``). This process stands for SGLang's main process; like
``sglang.srt.entrypoints.engine`` it sets the ``spawn`` start method and starts a
``multiprocessing.Process`` with a pipe back (as for ``run_scheduler_process``); that
child stands for the scheduler, which owns the NIXL KV manager. Each reports what is
installed and active in it; the JSON goes to stdout.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from importlib import metadata
from multiprocessing.connection import Connection
from typing import Any, Final

SCHEDULER_TIMEOUT_SECONDS: Final = 120.0
KV_CLASS_TYPES: Final = ("MANAGER", "SENDER", "RECEIVER", "BOOTSTRAP_SERVER")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def process_report() -> dict[str, Any]:
    """What this process has: the seam's record, versions, the NIXL KV classes, fixes.

    The KV classes are looked up first, as SGLang does before it creates a KV manager:
    that lookup is what activates the armed hardening."""
    from pdwarden_runtime.sglang_boot.activate import STATE
    from pdwarden_runtime.sglang_boot.prom_bridge import multiprocess_mode_active

    report: dict[str, Any] = {
        "pid": os.getpid(),
        # arming must not have loaded SGLang (processes that never use NIXL stay light)
        "nixl_backend_loaded_before_lookup": STATE["trigger"] in sys.modules,
        "versions": {"sglang": _version("sglang"), "nixl": _version("nixl")},
        "prometheus_multiprocess": multiprocess_mode_active(),
    }
    try:
        from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class

        classes = {}
        for name in KV_CLASS_TYPES:
            cls = get_kv_class(TransferBackend.NIXL, KVClassType[name])
            classes[name.lower()] = f"{cls.__module__}.{cls.__qualname__}" if cls else None
        report["nixl_kv_classes"] = classes
    except Exception as err:
        report["kv_class_error"] = _error(err)
    try:
        from pdwarden_runtime import hardening

        report["supported"] = {
            "sglang": report["versions"]["sglang"] in hardening.SUPPORTED_SGLANG,
            "nixl": report["versions"]["nixl"] in hardening.SUPPORTED_NIXL,
        }
        report["fixes"] = dict(hardening.active_fixes())
        report["kv_classes_hardened"] = hardening.is_installed()
    except Exception as err:
        report["hardening_error"] = _error(err)
    report["seam"] = {k: v for k, v in STATE.items() if k != "traceback"}
    return report


def pod_configuration() -> dict[str, Any]:
    """The hardening settings this process runs with (from the pod's flags, which the
    launcher passes as PDWARDEN_* environment), and the environment that shapes them."""
    from pdwarden_runtime.hardening.config import installed_config

    config = installed_config()
    env = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("PDWARDEN_", "SGLANG_DISAGGREGATION_", "UCX_"))
        and k != "PDWARDEN_HARDENING_ON_ERROR"
    }
    return {
        "fixes": sorted(config.fixes),
        "stock_classes": config.stock_classes,
        "transfer_deadline": config.transfer_deadline,
        "inflight_deadline": config.inflight_deadline,
        "fault": config.fault.active,
        "env": env,
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scheduler_probe(writer: Connection) -> None:
    """The spawned child's target (SGLang's ``run_scheduler_process`` stand-in)."""
    try:
        report = process_report()
        try:
            report["configuration"] = pod_configuration()
            if report.get("kv_classes_hardened"):
                from pdwarden_runtime.sglang_boot.behaviour import behaviour_checks

                report["behaviour"] = behaviour_checks(_free_port)
        except Exception as err:
            report["behaviour_error"] = _error(err)
        writer.send(report)
    except Exception as err:
        writer.send({"pid": os.getpid(), "report_error": _error(err)})
    finally:
        writer.close()
    # Done: skip interpreter teardown (torch/NIXL finalizers are slow on a busy machine).
    sys.stdout.flush()
    os._exit(0)


def probe_tree() -> dict[str, Any]:
    """This process's report and a spawned scheduler-like child's."""
    mp.set_start_method("spawn", force=True)  # as sglang.srt.entrypoints.engine does
    reader, writer = mp.Pipe(duplex=False)
    proc = mp.Process(target=scheduler_probe, args=(writer,))
    proc.start()
    writer.close()
    result: dict[str, Any] = {"main": process_report(), "start_method": mp.get_start_method()}
    if reader.poll(SCHEDULER_TIMEOUT_SECONDS):
        try:
            result["scheduler"] = reader.recv()
        except EOFError:
            result["scheduler"] = {"report_error": "the spawned child died before reporting"}
    else:
        result["scheduler"] = {"report_error": f"no report within {SCHEDULER_TIMEOUT_SECONDS:.0f} s"}
    proc.join(30)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    result["scheduler"]["exitcode"] = proc.exitcode
    return result


def main() -> None:
    json.dump(probe_tree(), sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
