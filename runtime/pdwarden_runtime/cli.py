"""``pdwarden runtime ...``: the command a runtime pod runs.

``serve`` implements the pod command the operator renders
(``pdwarden_operator.render.runtime.runtime_command``):

    pdwarden runtime serve --role prefill|decode --engine synthetic|sglang --host $(POD_IP)
        --port 30000 --bootstrap-port 8998 --metrics-port 9400 [--worker-key-file F] [--allow-fault-injection]
        [--fault NAME] [--inflight-deadline S] [--transfer-deadline S] [synthetic flags]
        [-- <sglang server args>]

``--engine sglang`` hands over to ``pdwarden_runtime.engines.sglang_engine.serve`` (lazy:
SGLang's import is slow and only that engine needs it at start); ``doctor`` comes from
``pdwarden_runtime.doctor``.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import click

import pdwarden_contract as c
from pdwarden_runtime.group import GroupOptions
from pdwarden_runtime.hardening.config import (
    BENCH_HARDENING_MODES,
    DEFAULT_HELD_PAGES_PER_WRITER,
    DEFAULT_INFLIGHT_DEADLINE,
    DEFAULT_RACE_WINDOW,
    DEFAULT_TRANSFER_DEADLINE,
    HARDENING_MODES,
)
from pdwarden_runtime.transfer import nixl_progress
from pdwarden_runtime.worker_key import WorkerKeyError, read_key_file


@dataclass
class ServeOptions:
    role: str
    engine: str
    host: str
    port: int
    bootstrap_port: int
    metrics_port: int
    allow_fault_injection: bool
    fault: str
    inflight_deadline: float | None
    transfer_deadline: float
    hardening: str
    race_window: float
    model: str
    page_size: int
    pool_pages: int
    layers: int
    page_bytes: int
    aux_slots: int
    chunk_pages: int
    compute_ms: float
    token_interval_ms: float = 0.0
    nixl_progress_poll_us: int = nixl_progress.DEFAULT_POLL_US
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    worker_key_file: str | None = None
    worker_key_accept_file: tuple[str, ...] = ()  # repeatable
    side_channel_lenient: bool = False
    held_pages_per_writer: float = DEFAULT_HELD_PAGES_PER_WRITER

    @property
    def worker_key_accept_files(self) -> tuple[str, ...]:
        return tuple(self.worker_key_accept_file)

    def worker_key(self) -> str | None:
        """The model's worker key (None: the HTTP port takes requests without one); raises
        WorkerKeyError when the file cannot be used."""
        if self.worker_key_file is None:
            return None
        return read_key_file(self.worker_key_file)

    def accepted_worker_keys(self) -> tuple[str, ...]:
        """Every key the HTTP port takes: the worker key, then those a rotation adds."""
        own = self.worker_key()
        others = tuple(read_key_file(f) for f in self.worker_key_accept_files)
        return tuple(dict.fromkeys([*([own] if own is not None else []), *others]))

    def group(self) -> GroupOptions | None:
        """The replica's group (None: a single-pod replica); raises ValueError when malformed."""
        if self.nnodes == 1:
            return None
        if not self.dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr (the leader's HOST:PORT)")
        return GroupOptions(self.nnodes, self.node_rank, self.dist_init_addr)


class LazyGroup(click.Group):
    """Subcommands imported on first use (``doctor`` pulls in SGLang)."""

    lazy = {"doctor": ("pdwarden_runtime.doctor", "doctor")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, attr = self.lazy[name]
            command = getattr(importlib.import_module(module), attr)
            return command if isinstance(command, click.Command) else None
        return super().get_command(ctx, name)


@click.group("runtime", cls=LazyGroup)
def runtime() -> None:
    """The runtime inside prefill/decode pods: NIXL KV transfer, hardened, with metrics."""


def _deadline(value: str) -> float | None:
    if value.lower() in ("off", "none", "0"):
        return None
    seconds = float(value)
    if seconds <= 0:
        raise click.BadParameter("must be > 0 seconds, or 'off'")
    return seconds


@runtime.command("serve", context_settings={"ignore_unknown_options": False})
@click.option(c.ServeFlag.ROLE, type=click.Choice(c.RUNTIME_ROLES), required=True)
@click.option(c.ServeFlag.ENGINE, type=click.Choice(c.ENGINES), default="synthetic", show_default=True)
@click.option(
    c.ServeFlag.HOST,
    default=lambda: os.environ.get(c.ENV_POD_IP) or "127.0.0.1",
    show_default="$POD_IP, else 127.0.0.1",
    help="Address every port binds to.",
)
@click.option(c.ServeFlag.PORT, type=click.IntRange(1, 65535), default=c.DEFAULT_HTTP_PORT, show_default=True)
@click.option(
    c.ServeFlag.BOOTSTRAP_PORT,
    type=click.IntRange(1, 65535),
    default=c.DEFAULT_BOOTSTRAP_PORT,
    show_default=True,
    help="Prefill: SGLang's KV bootstrap server port.",
)
@click.option(
    c.ServeFlag.METRICS_PORT, type=click.IntRange(1, 65535), default=c.DEFAULT_METRICS_PORT, show_default=True
)
@click.option(c.ServeFlag.ALLOW_FAULT_INJECTION, is_flag=True, help="Serve POST /debug/fault (testing only).")
@click.option(
    "--fault",
    type=click.Choice(c.FAULTS),
    default=c.FAULT_NONE,
    show_default=True,
    help="Inject a fault from the start (testing only).",
)
@click.option(
    c.ServeFlag.INFLIGHT_DEADLINE,
    default=f"{DEFAULT_INFLIGHT_DEADLINE:g}",
    show_default=True,
    help="Seconds a room may wait for or move KV (from leaving Bootstrapping) before it is "
    "failed (the inflight_deadline fix), or 'off'.",
)
@click.option(
    c.ServeFlag.TRANSFER_DEADLINE,
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TRANSFER_DEADLINE,
    show_default=True,
    help="Seconds a NIXL handle may stay in progress before the room fails and the handle is "
    "quarantined (the transfer_deadline fix).",
)
@click.option(
    "--hardening",
    type=click.Choice((*HARDENING_MODES, *BENCH_HARDENING_MODES)),
    default="on",
    show_default=True,
    help="off: SGLang 0.5.23's NIXL classes, untouched (the control); emulated-port: an "
    "emulation of a NIXL port with the old max() status rule and no fix (tests, demo); "
    "bench-stock-prompt-wake: off, with each room's status change waking its request at "
    "once as hardened does (pdwarden bench transfer only; synthetic engine only).",
)
@click.option(
    "--race-window",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_RACE_WINDOW,
    show_default=True,
    help=f"{c.FAULT_EMULATED_PORT_RACE}: how long a finished chunk's status write waits for an ABORT.",
)
@click.option(
    "--held-pages-per-writer",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=DEFAULT_HELD_PAGES_PER_WRITER,
    show_default=True,
    help="Decode: the share of the KV pool that pages held for one prefill (its requests "
    "ended, awaiting its drain ACK) may exceed only by refusing that prefill's new requests.",
)
@click.option(
    c.ServeFlag.MODEL, default="pdwarden/synthetic", show_default=True, help="Synthetic: served model name."
)
@click.option(
    "--page-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Synthetic: tokens per KV page.",
)
@click.option(
    "--pool-pages",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Synthetic: KV pool size in pages.",
)
@click.option(
    "--layers",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Synthetic: layers (each a K and a V buffer).",
)
@click.option(
    "--page-bytes",
    type=click.IntRange(min=8),
    default=16384,
    show_default=True,
    help="Synthetic: bytes per page per buffer (multiple of 8).",
)
@click.option(
    "--aux-slots",
    type=click.IntRange(min=1),
    default=512,
    show_default=True,
    help="Synthetic: aux (metadata) slots, i.e. concurrent requests.",
)
@click.option(
    "--chunk-pages",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Synthetic prefill: pages per chunk sent.",
)
@click.option(
    "--compute-ms",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Synthetic prefill: simulated compute time between chunks.",
)
@click.option(
    "--token-interval-ms",
    type=click.FloatRange(min=0, max=60000),
    default=0.0,
    show_default=True,
    help="Synthetic decode: time between two tokens of an answer (0: all at once), so a stream "
    "can be read and cancelled mid-answer.",
)
@click.option(
    "--nixl-progress-poll-us",
    type=click.IntRange(0, nixl_progress.MAX_POLL_US),
    default=nixl_progress.DEFAULT_POLL_US,
    show_default=True,
    help="How long NIXL's progress thread may sleep when no transfer event arrives (an event "
    "wakes it at once), in every process that runs NIXL (the synthetic runtime, SGLang's "
    "schedulers); 0 is NIXL's own busy polling, a core per process.",
)
@click.option(
    c.ServeFlag.NNODES,
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Nodes (pods) of this replica; > 1: a group whose rank 0 serves (SGLang's --nnodes).",
)
@click.option(
    c.ServeFlag.NODE_RANK,
    type=click.IntRange(0, 63),
    default=0,
    show_default=True,
    help="This pod's rank in its group (SGLang's --node-rank).",
)
@click.option(
    c.ServeFlag.DIST_INIT_ADDR,
    default=None,
    help="HOST:PORT where the group's ranks rendezvous at rank 0 (SGLang's --dist-init-addr).",
)
@click.option(
    c.ServeFlag.WORKER_KEY_FILE,
    type=click.Path(dir_okay=False),
    default=None,
    help="A file holding the model's worker key: the HTTP port then answers 401 without "
    "`Authorization: Bearer <key>` (except /health* and /metrics); with --engine sglang, SGLang's "
    "--api-key. The PD side channel (KV bootstrap routes, ZMQ messages) then carries a proof "
    "derived from it.",
)
@click.option(
    c.ServeFlag.WORKER_KEY_ACCEPT_FILE,
    type=click.Path(dir_okay=False),
    multiple=True,
    help="A file holding another worker key this pod accepts too (on its HTTP port and the PD "
    "side channel) while the model's key rotates; it still uses --worker-key-file's. Repeatable.",
)
@click.option(
    c.ServeFlag.SIDE_CHANNEL_LENIENT,
    is_flag=True,
    default=False,
    help="While the model's key is switched on or off: the PD side channel also takes messages "
    "and requests without a proof (this pod still signs its own).",
)
@click.option("--log-level", default="WARNING", show_default=True)
@click.argument("sglang_args", nargs=-1, type=click.UNPROCESSED)
def serve(sglang_args: tuple[str, ...], log_level: str, inflight_deadline: str, **kwargs: Any) -> None:
    """Serve one role of a runtime pod (HTTP, metrics, KV transfer)."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        deadline = _deadline(inflight_deadline)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--inflight-deadline") from None
    options = ServeOptions(inflight_deadline=deadline, compute_ms=kwargs.pop("compute_ms"), **kwargs)
    if options.page_bytes % 8:
        raise click.BadParameter("must be a multiple of 8", param_hint="--page-bytes")
    try:
        options.group()
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    if options.worker_key_accept_files and options.worker_key_file is None:
        raise click.UsageError(f"{c.ServeFlag.WORKER_KEY_ACCEPT_FILE} needs {c.ServeFlag.WORKER_KEY_FILE}")
    try:
        keys = options.accepted_worker_keys()
    except WorkerKeyError as err:
        raise click.BadParameter(str(err), param_hint="--worker-key-file") from None
    if options.engine == "sglang":
        from pdwarden_runtime.engines.sglang_engine import serve as serve_sglang

        sys.exit(serve_sglang(options, list(sglang_args)))
    if sglang_args:
        given = " ".join(sglang_args)
        raise click.UsageError(f"the synthetic engine takes no SGLang arguments (got {given})")
    sys.exit(_serve_synthetic(options, keys))


@runtime.command(
    "router", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option("--host", required=True, help="The address clients reach (the pod's IP).")
@click.option("--port", type=click.IntRange(1, 65535), default=c.ROUTER_HTTP_PORT, show_default=True)
@click.option(
    "--router-port",
    type=click.IntRange(1, 65535),
    default=c.ROUTER_LOOPBACK_PORT,
    show_default=True,
    help="The loopback port smg listens on (its own --port).",
)
@click.option(
    "--worker-key-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The model's worker key, presented to smg for every client (none: the model has no key).",
)
@click.option(
    "--served-model-name",
    default=None,
    help="The model's served name, added as its model to a native /generate JSON body that names "
    "none (smg routes by model under discovery); none: bodies pass as they are.",
)
@click.option("--log-level", default="WARNING", show_default=True)
@click.argument("router_args", nargs=-1, required=True, type=click.UNPROCESSED)
def router(
    host: str,
    port: int,
    router_port: int,
    worker_key_file: str | None,
    served_model_name: str | None,
    log_level: str,
    router_args: tuple[str, ...],
) -> None:
    """Run SGLang's router (ROUTER_ARGS: smg's command, listening on 127.0.0.1:--router-port)
    behind the model's front door on HOST:PORT: only the serving routes pass, with the model's
    worker key presented for every client; smg's control plane answers no one."""
    import asyncio

    from pdwarden_runtime import router_gate

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    key = None
    if worker_key_file is not None:
        try:
            key = read_key_file(worker_key_file)
        except WorkerKeyError as err:
            raise click.BadParameter(str(err), param_hint="--worker-key-file") from None
    sys.exit(asyncio.run(router_gate.run(host, port, router_port, key, router_args, served_model_name)))


def _exit_failed(err: Exception) -> None:
    print(f"pdwarden runtime serve: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)  # SGLang's NIXL threads are not daemons: never hang on exit


def _serve_synthetic(options: ServeOptions, worker_keys: tuple[str, ...]) -> int:
    import asyncio

    group = options.group()
    if group is not None and not group.leader:
        from pdwarden_runtime.group_worker import run_worker

        try:
            asyncio.run(run_worker(options.role, options.host, options.port, options.metrics_port, group))
        except Exception as err:
            _exit_failed(err)
        return 0

    from pdwarden_runtime.engines.synthetic import SyntheticOptions, build_engine
    from pdwarden_runtime.hardening import HardeningConfig
    from pdwarden_runtime.hardening.config import FaultSwitch, config_for_mode
    from pdwarden_runtime.server import run_synthetic

    nixl_progress.set_poll_us(options.nixl_progress_poll_us)
    hardening: HardeningConfig = config_for_mode(
        options.hardening,
        transfer_deadline=options.transfer_deadline,
        inflight_deadline=options.inflight_deadline,
        fault=FaultSwitch(options.fault),
        race_window=options.race_window,
        engine="synthetic",
        worker_key_file=options.worker_key_file,
        worker_key_accept_files=options.worker_key_accept_files,
        side_channel_lenient=options.side_channel_lenient,
        held_pages_per_writer=options.held_pages_per_writer,
    )
    engine = build_engine(
        SyntheticOptions(
            role=options.role,
            host=options.host,
            port=options.port,
            bootstrap_port=options.bootstrap_port,
            metrics_port=options.metrics_port,
            model=options.model,
            page_size=options.page_size,
            pool_pages=options.pool_pages,
            layers=options.layers,
            page_bytes=options.page_bytes,
            aux_slots=options.aux_slots,
            chunk_pages=options.chunk_pages,
            compute_ms_per_chunk=options.compute_ms,
            token_interval_ms=options.token_interval_ms,
        ),
        hardening,
    )
    try:
        asyncio.run(
            run_synthetic(
                engine,
                allow_fault_injection=options.allow_fault_injection,
                group=group,
                worker_keys=worker_keys,
            )
        )
    except Exception as err:
        _exit_failed(err)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
