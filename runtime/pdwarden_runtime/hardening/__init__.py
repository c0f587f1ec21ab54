"""pdwarden's hardening of SGLang's NIXL KV-transfer backend.

The seam (one, documented): ``install()`` rebinds the four NIXL class names in the
``sglang.srt.disaggregation.nixl`` package to pdwarden's subclasses. SGLang's
``sglang.srt.disaggregation.utils.get_kv_class`` imports those names from that package
on every call, so every KV manager, sender, receiver and bootstrap server SGLang creates
for ``--disaggregation-transfer-backend nixl`` in this process is a hardened one, however
early SGLang's own modules imported ``get_kv_class``. Nothing in SGLang is copied or
edited; the originals stay importable from ``sglang.srt.disaggregation.nixl.conn``.
SGLang spawns its scheduler processes fresh, so the caller must run ``install()`` in each
of them (``pdwarden_runtime.sglang_boot`` does, at interpreter start-up).

Supported versions are pinned: SGLang and NIXL internals the subclasses rely on change
between releases, so any other version fails ``install()`` with a message naming it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from importlib import metadata
from typing import Any, Final

from pdwarden_runtime.hardening.config import (
    ALL_FIXES,
    NO_FIXES,
    ConfigError,
    FaultSwitch,
    Fix,
    HardeningConfig,
    installed_config,
    set_installed_config,
)
from pdwarden_runtime.sglang_boot import TRIGGER_MODULE

SUPPORTED_SGLANG: Final = ("0.5.23",)
SUPPORTED_NIXL: Final = ("1.5.1",)
# The SGLang package whose names get_kv_class() imports for TransferBackend.NIXL: the same
# module whose import arms activation in SGLang's processes.
SEAM_MODULE: Final = TRIGGER_MODULE
SEAM_NAMES: Final = ("NixlKVManager", "NixlKVSender", "NixlKVReceiver", "NixlKVBootstrapServer")

_install_lock = threading.Lock()
_installed = False


class UnsupportedVersionError(RuntimeError):
    """The installed SGLang or NIXL is not one the hardening was built and tested for."""


def installed_versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for dist in ("sglang", "nixl"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    return found


def check_versions() -> dict[str, str]:
    """Raise UnsupportedVersionError unless SGLang and NIXL are supported versions."""
    found = installed_versions()
    problems = []
    for dist, supported in (("sglang", SUPPORTED_SGLANG), ("nixl", SUPPORTED_NIXL)):
        version = found[dist]
        if version is None:
            problems.append(f"{dist} is not installed (supported: {', '.join(supported)})")
        elif version not in supported:
            problems.append(f"{dist} {version} is not supported (supported: {', '.join(supported)})")
    if problems:
        raise UnsupportedVersionError(
            "pdwarden's NIXL hardening refuses to start: "
            + "; ".join(problems)
            + ". Install a supported version or upgrade pdwarden."
        )
    return {dist: str(version) for dist, version in found.items()}


def install(config: HardeningConfig | Mapping[str, Any] | None = None) -> None:
    """Make SGLang's NIXL backend in THIS process use pdwarden's hardened classes.

    ``config``: a HardeningConfig, a mapping (``HardeningConfig.from_mapping``), or None
    (read PDWARDEN_* environment variables). Idempotent; a later call replaces the config
    for managers created afterwards."""
    if config is None:
        resolved = HardeningConfig.from_env()
    elif isinstance(config, HardeningConfig):
        resolved = config
    else:
        resolved = HardeningConfig.from_mapping(config)
    check_versions()
    global _installed
    with _install_lock:
        set_installed_config(resolved)
        if resolved.stock_classes:
            return  # --hardening off: SGLang's own classes, untouched
        import importlib

        seam = importlib.import_module(SEAM_MODULE)
        from pdwarden_runtime.hardening.nixl import HARDENED_CLASSES

        for name in SEAM_NAMES:
            setattr(seam, name, HARDENED_CLASSES[name])
        _installed = True


def is_installed() -> bool:
    """True when get_kv_class(TransferBackend.NIXL, ...) returns pdwarden's classes."""
    if not _installed:
        return False
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class

    from pdwarden_runtime.hardening.nixl import HARDENED_CLASSES

    return get_kv_class(TransferBackend.NIXL, KVClassType.MANAGER) is HARDENED_CLASSES["NixlKVManager"]


def active_fixes() -> dict[str, bool]:
    """Which fixes the hardened classes apply in this process (all False if not installed)."""
    if not _installed:
        return HardeningConfig(fixes=frozenset()).active_fixes()
    return installed_config().active_fixes()


__all__ = [
    "ALL_FIXES",
    "NO_FIXES",
    "SEAM_MODULE",
    "SUPPORTED_NIXL",
    "SUPPORTED_SGLANG",
    "ConfigError",
    "FaultSwitch",
    "Fix",
    "HardeningConfig",
    "UnsupportedVersionError",
    "active_fixes",
    "check_versions",
    "install",
    "installed_config",
    "installed_versions",
    "is_installed",
]
