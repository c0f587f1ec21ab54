"""Install the hardening in this process from the environment the launcher set.

``sitecustomize`` calls ``arm_from_env()`` at interpreter start in every process of a
hardened SGLang tree. Arming imports nothing heavy: it adds an import hook that installs
the hardening right after SGLang's NIXL package (``TRIGGER_MODULE``) has loaded. That
package is imported only by ``get_kv_class(TransferBackend.NIXL, ...)`` -- the call the
scheduler (KV manager, sender/receiver) and the main process (bootstrap server) make --
so the hardened classes are in place before that call returns, while processes that never
touch NIXL (detokenizer, multiprocessing's resource tracker, compile workers) do not pay
for importing SGLang and torch.

A failed activation either ends the process with a clear message (``exit``: a scheduler
must not serve unhardened; SGLang then reports its child's death) or is recorded for the
doctor (``record``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

from pdwarden_runtime.sglang_boot import ENV_HARDENING, ENV_HARDENING_CONFIG, ENV_ON_ERROR, TRIGGER_MODULE
from pdwarden_runtime.sglang_boot.auth_keys import AUTH_MODULE

SEAM: Final = "sitecustomize"
EXIT_ACTIVATION_FAILED: Final = 78  # EX_CONFIG

# What happened in this process (read by the doctor's probe).
STATE: dict[str, Any] = {
    "seam": SEAM,
    "trigger": TRIGGER_MODULE,
    "armed": False,
    "attempted": False,
    "activated": False,
    "error": None,
}
_lock = threading.RLock()


def arm_from_env() -> None:
    """Activate when SGLang's NIXL package loads (at once if it already has)."""
    with _lock:
        if STATE["armed"]:
            return
        STATE["armed"] = True
        STATE["pid"] = os.getpid()
        _arm_accepted_keys()
        if TRIGGER_MODULE in sys.modules:
            activate_from_env()
            return
        sys.meta_path.insert(0, _AfterImport(TRIGGER_MODULE, activate_from_env))


def _arm_accepted_keys() -> None:
    """While the model's key rotates: SGLang's HTTP auth also takes the other worker key
    (``auth_keys``), in the process that serves HTTP, once SGLang's auth module loads."""
    try:
        config = json.loads(os.environ.get(ENV_HARDENING_CONFIG) or "{}")
        files = config.get("worker_key_accept_files") if isinstance(config, dict) else None
    except ValueError:
        return  # activate_from_env reports a malformed config
    if not files:
        return

    def install_keys() -> None:
        from pdwarden_runtime.sglang_boot.auth_keys import accept_also
        from pdwarden_runtime.worker_key import read_key_file

        accept_also(sys.modules[AUTH_MODULE], [read_key_file(f) for f in files])

    if AUTH_MODULE in sys.modules:
        install_keys()
    else:
        sys.meta_path.insert(0, _AfterImport(AUTH_MODULE, install_keys))


def activate_from_env() -> bool:
    """Install the hardening once per process; True when it is installed."""
    with _lock:
        if STATE["attempted"]:
            return bool(STATE["activated"])
        STATE["attempted"] = True
        STATE["pid"] = os.getpid()
        try:
            config = json.loads(os.environ.get(ENV_HARDENING_CONFIG) or "{}")
            if not isinstance(config, dict):
                raise ValueError(f"{ENV_HARDENING_CONFIG} must be a JSON object, got {config!r}")
            install(config)
        except BaseException as err:  # reported below, never swallowed silently
            STATE["error"] = f"{type(err).__name__}: {err}"
            STATE["traceback"] = traceback.format_exc()
            if os.environ.get(ENV_ON_ERROR, "exit") == "exit":
                sys.stderr.write(
                    f"pdwarden: could not activate the NIXL hardening in process {os.getpid()} "
                    f"({' '.join(sys.argv)[:200]}): {STATE['error']}\n{STATE['traceback']}"
                    f"pdwarden: refusing to run SGLang unhardened (unset {ENV_HARDENING} to run "
                    f"it without pdwarden).\n"
                )
                sys.stderr.flush()
                os._exit(EXIT_ACTIVATION_FAILED)
            return False
        STATE["activated"] = True
        return True


def install(raw: dict[str, Any]) -> None:
    """Hand the launcher's settings to the hardening (owned by pdwarden_runtime.hardening).

    The KV managers it hardens export their contract metrics through the multiprocess
    bridge (never a port of their own: the launcher serves the pod's metrics port).
    """
    from pdwarden_runtime import hardening
    from pdwarden_runtime.hardening.config import HardeningConfig
    from pdwarden_runtime.transfer import nixl_progress

    settings = dict(raw)
    # NIXL's progress thread in SGLang's processes: the idle poll delay (as in the synthetic
    # engine), set before SGLang's KV manager creates its agent.
    nixl_progress.set_poll_us(int(settings.pop("nixl_progress_poll_us", nixl_progress.DEFAULT_POLL_US)))
    config = HardeningConfig.from_mapping({**settings, "metrics_port": None})
    config.on_metrics_registry = _bridge_metrics
    hardening.install(config)


def _bridge_metrics(registry: Any) -> None:
    from pdwarden_runtime.sglang_boot.prom_bridge import bridge

    bridge(registry)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after module ``name`` has executed (one shot)."""

    def __init__(self, name: str, callback: Callable[[], object]) -> None:
        self._name = name
        self._callback = callback
        self._searching = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self._name or self._searching:
            return None
        self._searching = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._searching = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenCall(spec.loader, self._fire)
        return spec

    def _fire(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._callback()


class _ThenCall(importlib.abc.Loader):
    """A loader that delegates to ``inner`` and calls ``after`` once the module ran."""

    def __init__(self, inner: Any, after: Callable[[], None]) -> None:
        self._inner = inner
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._inner.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._after()

    def __getattr__(self, name: str) -> Any:  # get_code, is_package, resource readers...
        return getattr(self._inner, name)
