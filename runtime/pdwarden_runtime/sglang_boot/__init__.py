"""Spawn-time activation of the NIXL hardening in every process SGLang starts.

SGLang's server sets ``multiprocessing.set_start_method("spawn")`` and starts its
scheduler (the process that owns the NIXL KV manager), its detokenizer and, with DP,
its data-parallel controller as fresh interpreters; a monkeypatch made in the launcher
would be lost in them. The seam chosen here is ``sitecustomize``: the launcher prepends
``SITE_DIR`` (a directory holding only ``sitecustomize.py``) to ``PYTHONPATH`` and sets
``PDWARDEN_HARDENING=1``. Every Python process that inherits that environment -- spawned,
forked-and-exec'd or started with ``subprocess`` -- runs ``sitecustomize`` at interpreter
start-up, before it unpickles its target; it arms an import hook that installs the
hardening the moment SGLang's NIXL package loads (``activate``), i.e. inside the first
``get_kv_class(TransferBackend.NIXL, ...)`` call, before any KV class is handed out.
Why not the alternatives:

- a ``.pth`` file in site-packages would act in every Python of the environment, not
  only in processes the launcher starts;
- SGLang's plugin entry points (``sglang.srt.plugins``) run only where SGLang calls
  ``load_plugins()`` and swallow a failing plugin with a log line; a pod must not serve
  unhardened because of a log line.

``sitecustomize`` is looked up once per interpreter, so ours chains to the one it
shadows (Debian's, a base image's). Interpreters started with ``-S``, ``-I`` or ``-E``
skip it; SGLang starts none of those (the doctor checks the spawn path SGLang uses).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

# The directory put first on PYTHONPATH; it holds nothing but sitecustomize.py.
SITE_DIR: Final = Path(__file__).resolve().parent / "site"

# The package whose names get_kv_class() imports for NIXL: its import arms the activation
# (sglang_boot.activate) and it is the seam the hardening replaces names in (hardening).
TRIGGER_MODULE: Final = "sglang.srt.disaggregation.nixl"
ENV_HARDENING: Final = "PDWARDEN_HARDENING"  # "1" activates the seam
ENV_HARDENING_CONFIG: Final = "PDWARDEN_HARDENING_CONFIG"  # JSON for hardening.install()
# What a process does when activation fails: "exit" (the launcher: never serve
# unhardened) or "record" (the doctor: report the error instead).
ENV_ON_ERROR: Final = "PDWARDEN_HARDENING_ON_ERROR"
# The prometheus_client multiprocess directory shared by SGLang and pdwarden.
ENV_PROM_DIR: Final = "PROMETHEUS_MULTIPROC_DIR"

OnError = Literal["exit", "record"]

# SGLang frees a decode's device pages held for an aborted room after this many seconds
# even without the prefill's drain ACK ("releasing anyway"): a clock cannot prove a write
# over. With the hardening on it is set out of reach, and pages go on the drain ACK or on
# proof that the writer is gone (hardening.writer_watch), in every SGLang process.
ENV_SGLANG_DEFERRED_RELEASE_TIMEOUT: Final = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT"
NEVER_S: Final = "315360000"  # ten years


def seam_env(
    base_env: Mapping[str, str],
    config: Mapping[str, Any],
    *,
    prom_dir: str | None = None,
    on_error: OnError = "exit",
) -> dict[str, str]:
    """The environment for a process tree with the hardening active in every process.

    Pure: returns a new mapping; ``SITE_DIR`` goes first on PYTHONPATH, existing entries
    are kept after it (so user paths and a base image's own sitecustomize still work).
    """
    env = dict(base_env)
    site = str(SITE_DIR)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    env["PYTHONPATH"] = os.pathsep.join([site, *rest])
    env[ENV_HARDENING] = "1"
    env[ENV_HARDENING_CONFIG] = json.dumps(dict(config), sort_keys=True)
    env[ENV_ON_ERROR] = on_error
    if str(config.get("hardening", "on")).strip().lower() == "on":
        env[ENV_SGLANG_DEFERRED_RELEASE_TIMEOUT] = NEVER_S
    if prom_dir is not None:
        env[ENV_PROM_DIR] = prom_dir
    return env
