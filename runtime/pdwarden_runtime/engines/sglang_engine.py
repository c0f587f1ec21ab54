"""The `sglang` engine: run SGLang's own server as a prefill or decode pod, hardened.

`pdwarden runtime serve --engine sglang --role R ... -- <sglang args>` ends up in
`serve()`: it adds the arguments a pdwarden pod needs (role, NIXL, ports, metrics) to the
user's SGLang arguments, refuses a user argument that contradicts them, starts
`python -m sglang.launch_server` in the environment that activates the hardening in every
process SGLang spawns (`sglang_boot`), serves the contract metrics those processes write
on the metrics port, and stops SGLang's process tree when it is told to stop.

The argument building is pure (`plan_launch`) so it is unit-tested without SGLang.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, Protocol

import click

import pdwarden_contract as c
from pdwarden_runtime.group import GroupOptions
from pdwarden_runtime.hardening.config import is_bench_mode

TRANSFER_BACKEND: Final = "nixl"
SGLANG_MODULE: Final = "sglang.launch_server"

# Flags pdwarden sets, by the dest SGLang's parser stores them in, with every spelling
# SGLang 0.5.23 accepts for them (tests/integration checks this table against SGLang's
# own parser). A user argument for one of them must agree with pdwarden's value.
MANAGED_FLAGS: Final[dict[str, tuple[str, ...]]] = {
    "disaggregation_mode": ("--disaggregation-mode",),
    "disaggregation_transfer_backend": ("--disaggregation-transfer-backend",),
    "disaggregation_bootstrap_port": ("--disaggregation-bootstrap-port",),
    "host": ("--host",),
    "port": ("--port",),
    # Only for a multi-node replica (`serve --nnodes N`); otherwise the user's, untouched.
    "nnodes": ("--nnodes",),
    "node_rank": ("--node-rank",),
    "dist_init_addr": ("--dist-init-addr", "--nccl-init-addr"),
}
# Boolean flags pdwarden turns on; the user may give them too (no value to disagree on).
MANAGED_SWITCHES: Final[dict[str, tuple[str, ...]]] = {
    "enable_metrics": ("--enable-metrics",),
}
# User flags that contradict a pod with a fixed role, with the reason.
FORBIDDEN_FLAGS: Final[dict[str, str]] = {
    "--enable-pd-role-switch": "a pdwarden pod has one fixed role (its pod label says which); "
    "run separate prefill and decode pods instead",
}
# Read (never changed) to describe the launch: tensor and data parallel sizes. "--tp" and
# "--dp" are argparse abbreviations SGLang resolves uniquely (the operator renders "--tp").
TP_FLAGS: Final = ("--tp-size", "--tensor-parallel-size", "--tp")
DP_FLAGS: Final = ("--dp-size", "--data-parallel-size", "--dp")
_INT_DESTS: Final = frozenset({"disaggregation_bootstrap_port", "port", "nnodes", "node_rank"})


class SglangArgumentError(ValueError):
    """The user's SGLang arguments contradict what pdwarden sets, or are malformed."""


class ServeOptions(Protocol):
    """What `serve()` needs from `pdwarden runtime serve`'s options."""

    role: str
    host: str
    port: int
    bootstrap_port: int
    metrics_port: int

    def worker_key(self) -> str | None: ...


# SGLang's own --api-key carries the model's worker key (the launch adds it, never shown).
API_KEY_FLAG: Final = "--api-key"
# SGLang's admin routes (weights, LoRA adapters, logging, profiles, aborts) take this key instead
# of --api-key once it is set: with the worker key, the launch sets one of its own.
ADMIN_API_KEY_FLAG: Final = "--admin-api-key"


def _gives(user_args: Sequence[str], flag: str, shortest: int) -> str | None:
    """The option of `user_args` that argparse would read as `flag` (any unambiguous prefix at
    least `shortest` characters long), or None."""
    for token in user_args:
        name = token.partition("=")[0]
        if name == flag or (len(name) >= shortest and flag.startswith(name)):
            return name
    return None


def worker_key_args(key: str | None, user_args: Sequence[str], admin_key: str | None = None) -> list[str]:
    """SGLang's arguments for the model's worker key: none without one; a user's own --api-key
    beside it is refused (the router presents the model's key, so another would lock it out).
    The worker key opens the serving routes only: unless the user gives an --admin-api-key of
    their own, SGLang's admin routes get `admin_key` (a fresh one per process by default, held
    by no one: the router and whoever holds the worker key cannot reach them)."""
    if key is None:
        return []
    given = _gives(user_args, API_KEY_FLAG, len("--api") + 1)
    if given is not None:
        raise SglangArgumentError(
            f"SGLang argument {given}: the model's worker key is SGLang's {API_KEY_FLAG} (the "
            "operator mounts it and the router presents it); leave it out"
        )
    out = [f"{API_KEY_FLAG}={key}"]  # one token: a key may start with "-"
    if _gives(user_args, ADMIN_API_KEY_FLAG, len("--adm")) is None:
        out.append(f"{ADMIN_API_KEY_FLAG}={admin_key or secrets.token_urlsafe(32)}")
    return out


@dataclass(frozen=True)
class LaunchPlan:
    """The SGLang command line: what pdwarden adds and what the user passed, untouched."""

    role: str
    added: tuple[str, ...]
    user: tuple[str, ...]
    already_given: tuple[str, ...] = ()  # managed flags the user gave with pdwarden's value
    tp_size: int = 1
    dp_size: int = 1

    @property
    def sglang_args(self) -> list[str]:
        return [*self.added, *self.user]

    def command(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", SGLANG_MODULE, *self.sglang_args]

    def describe(self) -> str:
        lines = [
            f"pdwarden: launching SGLang as {self.role} (tp={self.tp_size}, dp={self.dp_size}, "
            f"transfer backend {TRANSFER_BACKEND}, NIXL hardening armed in every SGLang process)",
            "pdwarden: arguments added to SGLang: " + (" ".join(self.added) or "(none)"),
            "pdwarden: your SGLang arguments (untouched): " + (" ".join(self.user) or "(none)"),
        ]
        if self.already_given:
            lines.append(
                "pdwarden: already in your arguments with pdwarden's value: " + " ".join(self.already_given)
            )
        return "\n".join(lines)


@dataclass
class _Scan:
    values: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # dest -> [(flag, value)]
    switches: set[str] = field(default_factory=set)
    ints: dict[str, str] = field(default_factory=dict)  # "tp"/"dp" -> raw value


def _flag_index() -> dict[str, tuple[str, str]]:
    index: dict[str, tuple[str, str]] = {}
    for dest, flags in MANAGED_FLAGS.items():
        index.update({f: ("value", dest) for f in flags})
    for dest, flags in MANAGED_SWITCHES.items():
        index.update({f: ("switch", dest) for f in flags})
    index.update({f: ("int", "tp") for f in TP_FLAGS})
    index.update({f: ("int", "dp") for f in DP_FLAGS})
    return index


def _scan(tokens: Sequence[str]) -> _Scan:
    """Find the flags pdwarden cares about in SGLang arguments (argparse's spellings)."""
    index = _flag_index()
    every_spelling = [f for flags in (*MANAGED_FLAGS.values(), *MANAGED_SWITCHES.values()) for f in flags]
    scan = _Scan()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--") or token == "--":
            continue
        name, has_eq, inline = token.partition("=")
        if name in FORBIDDEN_FLAGS:
            raise SglangArgumentError(f"SGLang argument {name} is not allowed: {FORBIDDEN_FLAGS[name]}")
        kind_dest = index.get(name)
        if kind_dest is None:
            # argparse accepts unique prefixes: "--disaggregation-m" would silently mean
            # --disaggregation-mode and dodge the conflict check.
            meant = [f for f in every_spelling if f.startswith(name) and len(name) > 2]
            if meant:
                raise SglangArgumentError(
                    f"SGLang argument {name} abbreviates {meant[0]}, which pdwarden sets; "
                    f"spell it out in full"
                )
            continue
        kind, dest = kind_dest
        if kind == "switch":
            if has_eq:
                raise SglangArgumentError(f"SGLang argument {name} is a switch and takes no value")
            scan.switches.add(dest)
            continue
        if has_eq:
            value = inline
        elif i < len(tokens) and not tokens[i].startswith("--"):
            value = tokens[i]
            i += 1
        else:
            raise SglangArgumentError(f"SGLang argument {name} needs a value")
        if kind == "int":
            scan.ints[dest] = value
        else:
            scan.values.setdefault(dest, []).append((name, value))
    return scan


def _same(dest: str, user_value: str, ours: str) -> bool:
    if dest in _INT_DESTS:
        try:
            return int(user_value) == int(ours)
        except ValueError:
            raise SglangArgumentError(
                f"SGLang argument for {dest.replace('_', '-')} must be an integer, got {user_value!r}"
            ) from None
    return user_value == ours


def _positive_int(what: str, raw: str | None) -> int:
    if raw is None:
        return 1
    try:
        value = int(raw)
    except ValueError:
        raise SglangArgumentError(f"SGLang {what} must be a positive integer, got {raw!r}") from None
    if value < 1:
        raise SglangArgumentError(f"SGLang {what} must be a positive integer, got {value}")
    return value


def pdwarden_sglang_flags(
    role: str, host: str, port: int, bootstrap_port: int, group: GroupOptions | None = None
) -> dict[str, str]:
    """pdwarden's value for every managed flag (by dest); the group's flags only for a group."""
    if role not in c.RUNTIME_ROLES:
        raise SglangArgumentError(f"unknown role {role!r}; expected one of {c.RUNTIME_ROLES}")
    for name, p in (("port", port), ("bootstrap port", bootstrap_port)):
        if not 0 < p < 65536:
            raise SglangArgumentError(f"{name} must be in 1..65535, got {p}")
    if port == bootstrap_port:
        raise SglangArgumentError(f"port and bootstrap port must differ (both {port})")
    flags = {
        "disaggregation_mode": role,
        "disaggregation_transfer_backend": TRANSFER_BACKEND,
        "disaggregation_bootstrap_port": str(bootstrap_port),
        "host": host,
        "port": str(port),
    }
    if group is not None:
        flags.update(
            nnodes=str(group.nnodes), node_rank=str(group.node_rank), dist_init_addr=group.dist_init_addr
        )
    return flags


def plan_launch(
    role: str,
    host: str,
    port: int,
    bootstrap_port: int,
    user_args: Sequence[str],
    config_file_args: Sequence[str] = (),
    group: GroupOptions | None = None,
) -> LaunchPlan:
    """Build SGLang's arguments for a pdwarden pod. Pure.

    ``user_args`` pass through untouched; pdwarden's flags are added in front, except
    those the user already gave with the same value. A user value that differs from
    pdwarden's (on the command line or in ``config_file_args``, the flags an SGLang
    ``--config`` file expands to) is an error naming both values.
    """
    ours = pdwarden_sglang_flags(role, host, port, bootstrap_port, group)
    scan = _scan([*user_args, *config_file_args])
    conflicts = []
    given = []
    for dest, occurrences in scan.values.items():
        if dest not in ours:
            continue  # a group flag of a single-pod replica: the user's own
        for flag, value in occurrences:
            if _same(dest, value, ours[dest]):
                given.append(f"{flag} {value}")
            else:
                conflicts.append(f"{flag} {value} (pdwarden sets {MANAGED_FLAGS[dest][0]} {ours[dest]})")
    if conflicts:
        raise SglangArgumentError(
            "SGLang arguments conflict with what pdwarden sets for this "
            f"{role} pod: "
            + "; ".join(conflicts)
            + ". Set these through `pdwarden runtime serve` options (--role, --host, --port, "
            "--bootstrap-port, and for a group --nnodes, --node-rank, --dist-init-addr) instead; the "
            "transfer backend is always nixl."
        )
    added: list[str] = []
    for dest, value in ours.items():
        if dest not in scan.values:
            added += [MANAGED_FLAGS[dest][0], value]
    for dest, flags in MANAGED_SWITCHES.items():
        if dest in scan.switches:
            given.append(flags[0])
        else:
            added.append(flags[0])
    return LaunchPlan(
        role=role,
        added=tuple(added),
        user=tuple(user_args),
        already_given=tuple(given),
        tp_size=_positive_int("--tp-size", scan.ints.get("tp")),
        dp_size=_positive_int("--dp-size", scan.ints.get("dp")),
    )


def _group(options: Any) -> GroupOptions | None:
    group = getattr(options, "group", None)
    return group() if callable(group) else None


def config_file_args(user_args: Sequence[str]) -> list[str]:
    """The flags an SGLang ``--config FILE`` among ``user_args`` expands to (for the
    conflict check only; the file itself is passed through to SGLang untouched)."""
    path: str | None = None
    for i, token in enumerate(user_args):
        if token == "--config" and i + 1 < len(user_args):
            path = user_args[i + 1]
        elif token.startswith("--config="):
            path = token.partition("=")[2]
    if path is None:
        return []
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SglangArgumentError(f"cannot read SGLang --config file {path}: {err}") from err
    if not isinstance(data, dict):
        raise SglangArgumentError(f"SGLang --config file {path} must hold a mapping of argument names")
    tokens: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            tokens.append(flag)
        elif value is not False and value is not None:
            tokens += [flag, str(value)]
    return tokens


_HARDENING_OPTIONS: Final = (
    "hardening",
    "inflight_deadline",
    "transfer_deadline",
    "fault",
    "race_window",
    "nixl_progress_poll_us",
    "held_pages_per_writer",
    # A path: each SGLang process derives the PD side channel's key from the file itself.
    "worker_key_file",
    # While the key rotates or is switched on or off (paths and a switch, as above).
    "worker_key_accept_files",
    "side_channel_lenient",
)
_MISSING: Final = object()


def hardening_config(options: Any) -> dict[str, Any]:
    """The JSON-able settings every SGLang process hands to ``hardening.install``
    (``HardeningConfig.from_mapping`` keys; each KV manager knows its own role).
    ``inflight_deadline`` None means off and is passed as such."""
    config: dict[str, Any] = {"engine": "sglang"}
    for key in _HARDENING_OPTIONS:
        value = getattr(options, key, _MISSING)
        if value is not _MISSING and (value is not None or key == "inflight_deadline"):
            config[key] = value
    return config


def check_options(options: Any) -> None:
    """Options `serve --engine sglang` cannot honour, as clear errors."""
    if getattr(options, "allow_fault_injection", False):
        raise SglangArgumentError(
            "--allow-fault-injection is not supported with --engine sglang: the HTTP port is "
            "SGLang's own server, which has no POST /debug/fault; inject a fault from the start "
            "with --fault NAME instead (testing only)"
        )
    hardening = getattr(options, "hardening", None)
    if isinstance(hardening, str) and is_bench_mode(hardening):
        raise SglangArgumentError(
            f"--hardening {hardening} is a benchmark mode of the synthetic engine "
            "(pdwarden bench transfer), not supported with --engine sglang"
        )


# --- running -----------------------------------------------------------------------------
STOP_GRACE_SECONDS: Final = 30.0


def serve(options: ServeOptions, sglang_args: Sequence[str]) -> int:
    """Run SGLang for ``options.role`` until it exits or we are told to stop (SIGTERM/SIGINT).

    Returns the exit status for `pdwarden runtime serve`: SGLang's own, or 0 after a
    requested stop that SGLang honoured within the grace period.
    """
    from pdwarden_runtime.sglang_boot import seam_env
    from pdwarden_runtime.sglang_boot.prom_bridge import serve_contract_metrics

    try:
        check_options(options)
        config_args = config_file_args(sglang_args)
        plan = plan_launch(
            options.role,
            options.host,
            options.port,
            options.bootstrap_port,
            sglang_args,
            config_args,
            _group(options),
        )
        key_args = worker_key_args(options.worker_key(), [*sglang_args, *config_args])
    except SglangArgumentError as err:
        raise click.UsageError(str(err)) from None  # exit status 2, no traceback
    stopping = threading.Event()
    started: list[subprocess.Popen[bytes]] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for proc in started:
            _signal_group(proc, signal.SIGTERM)

    # handlers first: a stop that arrives while SGLang starts must still reach it
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    prom_dir = tempfile.mkdtemp(prefix=f"pdwarden-{options.role}-prom-")
    metrics = None
    try:
        env = seam_env(os.environ, hardening_config(options), prom_dir=prom_dir, on_error="exit")
        env.setdefault(c.ENV_ROLE, options.role)
        print(plan.describe(), flush=True)
        if key_args:
            print(f"pdwarden: {API_KEY_FLAG} from the model's worker key file (not shown)", flush=True)
        metrics = serve_contract_metrics(prom_dir, options.host, options.metrics_port)
        print(f"pdwarden: contract metrics on {metrics.url} (from {prom_dir})", flush=True)
        command = [*plan.command(), *key_args]
        started.append(subprocess.Popen(command, env=env, start_new_session=True))
        if stopping.is_set():
            _signal_group(started[0], signal.SIGTERM)
        code = _wait(started[0], stopping)
    finally:
        for proc in started:
            _signal_group(proc, signal.SIGKILL)  # leftovers of SGLang's process tree
        for s, handler in previous.items():
            signal.signal(s, handler)
        if metrics is not None:
            metrics.stop()
        shutil.rmtree(prom_dir, ignore_errors=True)
    print(f"pdwarden: SGLang exited with status {code}", file=sys.stderr, flush=True)
    if stopping.is_set() and code != -signal.SIGKILL:
        return 0
    return code if code >= 0 else 128 - code


def _wait(proc: subprocess.Popen[bytes], stopping: threading.Event) -> int:
    """SGLang's exit status; SIGKILL its group if it outlives the stop grace period."""
    kill_at: float | None = None
    while (code := proc.poll()) is None:
        if stopping.is_set():
            kill_at = kill_at or time.monotonic() + STOP_GRACE_SECONDS
            if time.monotonic() > kill_at:
                _signal_group(proc, signal.SIGKILL)
        time.sleep(0.2)
    return code


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def launch_env_preview(options: ServeOptions, base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment `serve` gives SGLang, without a metrics dir (for tests and dry runs)."""
    from pdwarden_runtime.sglang_boot import seam_env

    return seam_env(base_env, hardening_config(options), on_error="exit")
