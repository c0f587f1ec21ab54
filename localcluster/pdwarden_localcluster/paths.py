"""Where the local cluster keeps things: all outside the checkout, except the sources."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# localcluster/pdwarden_localcluster -> localcluster -> repository root
REPO_ROOT = PACKAGE_DIR.parent.parent
GO_MODULE_DIR = PACKAGE_DIR.parent / "go"
COREDNS_MODULE_DIR = PACKAGE_DIR.parent / "go-coredns"
NETPOL_MODULE_DIR = PACKAGE_DIR.parent / "go-netpol"
MONITORING_MODULE_DIR = PACKAGE_DIR.parent / "go-monitoring"


def cache_dir() -> Path:
    """Build outputs and downloads, keyed by pinned versions ($PDWARDEN_CACHE)."""
    env = os.environ.get("PDWARDEN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pdwarden"


def state_dir() -> Path:
    """Pid files, logs, certificates and etcd data of the running cluster ($PDWARDEN_STATE_DIR)."""
    env = os.environ.get("PDWARDEN_STATE_DIR")
    return Path(env) if env else Path.home() / ".local" / "state" / "pdwarden" / "cluster"


def venv_bin() -> Path:
    """The project's virtualenv bin directory; pod commands run from here (first on PATH)."""
    return REPO_ROOT / ".venv" / "bin"
