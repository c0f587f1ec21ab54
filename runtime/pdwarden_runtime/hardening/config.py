"""Configuration of the NIXL hardening: which fixes, which deadlines, which fault.

One small object, built from keyword arguments, a mapping (JSON from a launcher) or the
environment, so the synthetic engine (flags) and SGLang's own scheduler processes (env,
set by the launcher before SGLang spawns them) configure the same hardened classes.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

# Fault names are the contract's (tests and the demo post them to /debug/fault); re-exported.
from pdwarden_contract import DEFAULT_INFLIGHT_DEADLINE_S, DEFAULT_TRANSFER_DEADLINE_S, FAULTS
from pdwarden_contract import FAULT_DROP_ABORT as FAULT_DROP_ABORT
from pdwarden_contract import FAULT_EMULATED_PORT_RACE as FAULT_EMULATED_PORT_RACE
from pdwarden_contract import FAULT_NONE as FAULT_NONE
from pdwarden_contract import FAULT_STALL as FAULT_STALL
from pdwarden_contract import FAULT_STALL_KV_RECEIVE as FAULT_STALL_KV_RECEIVE
from pdwarden_runtime.hardening.side_channel import SideKeys
from pdwarden_runtime.worker_key import WorkerKeyError, read_key_file

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pdwarden_runtime.status import Mode


class Fix(StrEnum):
    """The hardening's fixes, named for what they do (which module owns each: hardening/nixl.py)."""

    STICKY_STATUS = "sticky_status"  # Failed and Success are terminal (off: the max() rule)
    NO_SILENT_SKIP = "no_silent_skip"  # a chunk a worker would skip fails its room, aloud
    TRANSFER_DEADLINE = "transfer_deadline"  # stalled handles are quarantined, never released
    INFLIGHT_DEADLINE = "inflight_deadline"  # a room waiting or moving KV too long is failed
    METRICS = "metrics"  # the contract's metrics, and every hook guarded


ALL_FIXES: Final = frozenset(Fix)
# No fix: only metrics, which observe. With the hardened classes this is the emulated
# NIXL port (``max()`` status rule); with ``--hardening off`` the stock classes run and
# the metrics are read from outside them.
NO_FIXES: Final = frozenset({Fix.METRICS})
# --hardening: on = every fix; off = SGLang 0.5.23's NIXL classes, untouched (the control);
# emulated-port = pdwarden's classes with no fix and the old max() status rule: an
# emulation of the NIXL port the emulated-port race fault reproduces (tests, the demo).
HARDENING_ON: Final = "on"
HARDENING_OFF: Final = "off"
HARDENING_EMULATED_PORT: Final = "emulated-port"
HARDENING_MODES: Final = (HARDENING_ON, HARDENING_OFF, HARDENING_EMULATED_PORT)
# Bench only, never a default (``pdwarden bench transfer``'s third arm): SGLang's classes
# untouched as with off, but a status write that changes a room wakes the engine's request
# waiting on it at once, as the hardened manager's writes do; with off the request learns
# of it at the StockMirror's next copy. The synthetic engine alone takes it.
HARDENING_BENCH_STOCK_PROMPT_WAKE: Final = "bench-stock-prompt-wake"
BENCH_HARDENING_MODES: Final = (HARDENING_BENCH_STOCK_PROMPT_WAKE,)

ENV_FIXES: Final = "PDWARDEN_FIXES"  # "sticky_status,metrics" (Fix values) | "all" | "none"
ENV_HARDENING_MODE: Final = "PDWARDEN_HARDENING_MODE"  # one of HARDENING_MODES
ENV_TRANSFER_DEADLINE: Final = "PDWARDEN_TRANSFER_DEADLINE"
ENV_INFLIGHT_DEADLINE: Final = "PDWARDEN_INFLIGHT_DEADLINE"
ENV_FAULT: Final = "PDWARDEN_FAULT"
ENV_RACE_WINDOW: Final = "PDWARDEN_RACE_WINDOW"
ENV_METRICS_HOST: Final = "PDWARDEN_METRICS_HOST"
ENV_METRICS_PORT: Final = "PDWARDEN_METRICS_PORT"
ENV_ENGINE: Final = "PDWARDEN_ENGINE"
ENV_HELD_PAGES_PER_WRITER: Final = "PDWARDEN_HELD_PAGES_PER_WRITER"

DEFAULT_TRANSFER_DEADLINE: Final = float(DEFAULT_TRANSFER_DEADLINE_S)
DEFAULT_INFLIGHT_DEADLINE: Final = float(DEFAULT_INFLIGHT_DEADLINE_S)
# How long the emulated-port race fault holds a finished chunk's status write, waiting
# for the room's ABORT (it lets go as soon as the ABORT has been handled).
DEFAULT_RACE_WINDOW: Final = 5.0
# Decode: the share of its KV pool that pages held for one writer may reach before new
# requests to that writer are refused (a quarter: a writer that never drains can take no more,
# and a decode still serves three others that do).
DEFAULT_HELD_PAGES_PER_WRITER: Final = 0.25


class ConfigError(ValueError):
    """A hardening setting that cannot be used; the message names it."""


class FaultSwitch:
    """The fault currently injected; switchable at run time (``POST /debug/fault``)."""

    def __init__(self, fault: str = FAULT_NONE) -> None:
        self._lock = threading.Lock()
        self._fault = _valid_fault(fault)

    @property
    def active(self) -> str:
        return self._fault

    def set(self, fault: str) -> str:
        fault = _valid_fault(fault)
        with self._lock:
            self._fault = fault
        return fault

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self._fault == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass
class HardeningConfig:
    """What the hardened NIXL classes do. Defaults: every fix on, no fault."""

    fixes: frozenset[Fix] = ALL_FIXES
    transfer_deadline: float = DEFAULT_TRANSFER_DEADLINE
    inflight_deadline: float | None = DEFAULT_INFLIGHT_DEADLINE
    fault: FaultSwitch = dataclasses.field(default_factory=FaultSwitch)
    race_window: float = DEFAULT_RACE_WINDOW
    # Where a hardened KV manager serves its own /metrics (None: the embedding process
    # serves ``RoomRuntime.metrics.registry`` itself, as the synthetic engine does).
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    engine: str = "sglang"
    # True for --hardening off: SGLang's own classes run, install() rebinds nothing.
    stock_classes: bool = False
    # Bench only (HARDENING_BENCH_STOCK_PROMPT_WAKE): with stock_classes, a status write that
    # changes a room notifies the room's listeners at once (ignored without stock_classes).
    stock_prompt_wake: bool = False
    # Called with the metrics registry of each KV manager the hardening starts (SGLang's
    # processes bridge it into the pod's multiprocess metrics).
    on_metrics_registry: Callable[[CollectorRegistry], None] | None = None
    # The model's worker key file (a path, never the key: this config travels through the
    # environment to SGLang's processes). With one, the PD side channel carries a proof
    # derived from it (side_channel); without, it takes none, as SGLang's.
    worker_key_file: str | None = None
    # While a key rotates: files of further worker keys whose proofs are accepted too.
    worker_key_accept_files: tuple[str, ...] = ()
    # While a key is switched on or off: messages and requests without a proof are taken too.
    side_channel_lenient: bool = False
    side_keys: SideKeys = dataclasses.field(default_factory=SideKeys, repr=False, compare=False)
    # Decode: the share of the KV pool (0 < x <= 1) that pages held for one writer may
    # exceed only by refusing that writer's new requests (held pages are never freed by it).
    held_pages_per_writer: float = DEFAULT_HELD_PAGES_PER_WRITER

    def __post_init__(self) -> None:
        self.fixes = parse_fixes(list(self.fixes))
        if not self.transfer_deadline > 0:
            raise ConfigError(f"transfer deadline must be > 0 seconds, got {self.transfer_deadline!r}")
        if self.inflight_deadline is not None and not self.inflight_deadline > 0:
            raise ConfigError(
                f"inflight deadline must be > 0 seconds or None, got {self.inflight_deadline!r}"
            )
        if not self.race_window > 0:
            raise ConfigError(f"race window must be > 0 seconds, got {self.race_window!r}")
        if not 0 < self.held_pages_per_writer <= 1:
            raise ConfigError(
                "held pages per writer must be a share of the pool in (0, 1], "
                f"got {self.held_pages_per_writer!r}"
            )
        if isinstance(self.fault, str):
            self.fault = FaultSwitch(self.fault)
        self.worker_key_accept_files = tuple(self.worker_key_accept_files)
        if not self.side_keys.keyed and (self.worker_key_file or self.worker_key_accept_files):
            self.side_keys = _side_keys(
                self.worker_key_file, self.worker_key_accept_files, self.side_channel_lenient
            )

    def has(self, fix: Fix) -> bool:
        return fix in self.fixes

    @property
    def status_mode(self) -> Mode:
        return "sticky" if self.has(Fix.STICKY_STATUS) else "legacy"

    def active_fixes(self) -> dict[str, bool]:
        return {fix.value: fix in self.fixes for fix in Fix}

    # --- builders ---------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> HardeningConfig:
        """From JSON-like data: keys are the field names (``fixes`` as "sticky_status,metrics"
        or a list of Fix values,
        ``hardening``: "on"/"off" as a shorthand). Unknown keys are an error."""
        data = dict(values)
        kwargs: dict[str, Any] = {}
        mode = data.pop("hardening", None)
        if mode is not None:
            kwargs["fixes"] = _fixes_for_mode(str(mode))
            kwargs["stock_classes"] = _is_stock(str(mode))
            kwargs["stock_prompt_wake"] = _is_bench_prompt_wake(str(mode))
        if "fixes" in data:
            kwargs["fixes"] = parse_fixes(data.pop("fixes"))
        for name in ("transfer_deadline", "race_window", "held_pages_per_writer"):
            if name in data:
                kwargs[name] = _number(name, data.pop(name))
        if "inflight_deadline" in data:
            raw = data.pop("inflight_deadline")
            kwargs["inflight_deadline"] = (
                None if raw in (None, "", "off", 0) else _number("inflight_deadline", raw)
            )
        if "fault" in data:
            kwargs["fault"] = FaultSwitch(str(data.pop("fault") or FAULT_NONE))
        if "metrics_host" in data:
            kwargs["metrics_host"] = str(data.pop("metrics_host"))
        if "metrics_port" in data:
            raw = data.pop("metrics_port")
            kwargs["metrics_port"] = None if raw in (None, "") else int(_number("metrics_port", raw))
        if "engine" in data:
            kwargs["engine"] = str(data.pop("engine"))
        if "worker_key_file" in data:
            raw = data.pop("worker_key_file")
            kwargs["worker_key_file"] = None if raw in (None, "") else str(raw)
        if "worker_key_accept_files" in data:
            raw = data.pop("worker_key_accept_files")
            if not isinstance(raw, (list, tuple)) or not all(isinstance(f, str) and f for f in raw):
                raise ConfigError(f"worker_key_accept_files must be a list of paths, got {raw!r}")
            kwargs["worker_key_accept_files"] = tuple(raw)
        if "side_channel_lenient" in data:
            kwargs["side_channel_lenient"] = bool(data.pop("side_channel_lenient"))
        if data:
            raise ConfigError(f"unknown hardening setting(s) {sorted(data)}")
        return cls(**kwargs)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HardeningConfig:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        names = {
            ENV_HARDENING_MODE: "hardening",
            ENV_FIXES: "fixes",
            ENV_TRANSFER_DEADLINE: "transfer_deadline",
            ENV_INFLIGHT_DEADLINE: "inflight_deadline",
            ENV_FAULT: "fault",
            ENV_RACE_WINDOW: "race_window",
            ENV_METRICS_HOST: "metrics_host",
            ENV_METRICS_PORT: "metrics_port",
            ENV_ENGINE: "engine",
            ENV_HELD_PAGES_PER_WRITER: "held_pages_per_writer",
        }
        for env_name, key in names.items():
            if env.get(env_name, "") != "":
                values[key] = env[env_name]
        try:
            return cls.from_mapping(values)
        except ConfigError as err:
            raise ConfigError(f"{err} (from PDWARDEN_* environment variables)") from None


def parse_fixes(raw: Any) -> frozenset[Fix]:
    """ "sticky_status,metrics" | ["sticky_status", "metrics"] | "all" | "none" -> the fixes."""
    if isinstance(raw, str):
        text = raw.strip()
        if text.lower() in ("all", "on"):
            return ALL_FIXES
        if text.lower() in ("none", "off", ""):
            return frozenset()
        items = [part.strip() for part in text.split(",") if part.strip()]
    elif isinstance(raw, (list, tuple, set, frozenset)):
        items = [str(part).strip() for part in raw]
    else:
        raise ConfigError(f"fixes must be a comma-separated string or a list, got {raw!r}")
    known = {fix.value: fix for fix in Fix}
    unknown = sorted({item for item in items if item.lower() not in known})
    if unknown:
        raise ConfigError(f"unknown hardening fix(es) {unknown} in {raw!r}; expected some of {sorted(known)}")
    return frozenset(known[item.lower()] for item in items)


def _fixes_for_mode(mode: str) -> frozenset[Fix]:
    lowered = mode.strip().lower()
    if lowered in ("on", "1", "true", "yes"):
        return ALL_FIXES
    if _is_stock(mode) or lowered == HARDENING_EMULATED_PORT:
        return NO_FIXES
    raise ConfigError(
        f"hardening mode must be one of {list(HARDENING_MODES)} "
        f"(bench only: {list(BENCH_HARDENING_MODES)}), got {mode!r}"
    )


def _is_off(mode: str) -> bool:
    return mode.strip().lower() in ("off", "0", "false", "no")


def _is_bench_prompt_wake(mode: str) -> bool:
    return mode.strip().lower() == HARDENING_BENCH_STOCK_PROMPT_WAKE


def _is_stock(mode: str) -> bool:
    """SGLang's own classes run: off, or the bench-only stock arm."""
    return _is_off(mode) or _is_bench_prompt_wake(mode)


def is_bench_mode(mode: str) -> bool:
    """A ``--hardening`` value for benchmarks only (BENCH_HARDENING_MODES)."""
    return mode.strip().lower() in BENCH_HARDENING_MODES


def config_for_mode(mode: str, **kwargs: Any) -> HardeningConfig:
    """A HardeningConfig for a ``--hardening`` mode (see HARDENING_MODES, BENCH_HARDENING_MODES)."""
    return HardeningConfig(
        fixes=_fixes_for_mode(mode),
        stock_classes=_is_stock(mode),
        stock_prompt_wake=_is_bench_prompt_wake(mode),
        **kwargs,
    )


def _side_keys(sign: str | None, accept: Sequence[str], lenient: bool) -> SideKeys:
    try:
        return SideKeys.derive(
            read_key_file(sign) if sign else None, [read_key_file(f) for f in accept], lenient
        )
    except WorkerKeyError as err:
        raise ConfigError(str(err)) from None


def _valid_fault(fault: str) -> str:
    if fault not in FAULTS:
        raise ConfigError(f"unknown fault {fault!r}; expected one of {list(FAULTS)}")
    return fault


def _number(name: str, raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


# --- the configuration the hardened classes read (set by install()) -------------------
_installed: HardeningConfig | None = None
_installed_lock = threading.Lock()


def set_installed_config(config: HardeningConfig) -> None:
    global _installed
    with _installed_lock:
        _installed = config


def installed_config() -> HardeningConfig:
    """The config install() set; without install(), one read from the environment."""
    global _installed
    with _installed_lock:
        if _installed is None:
            _installed = HardeningConfig.from_env()
        return _installed
