"""`pdwarden operator run` and `pdwarden crd`."""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click
import uvloop

import pdwarden_contract as contract
from pdwarden_operator import podpolicy
from pdwarden_operator.watchdog.brake import DEFAULT_FLEET, DEFAULT_NAMESPACE, BrakeLimits, FleetLimits

if TYPE_CHECKING:
    from pdwarden_operator.context import OperatorContext
    from pdwarden_operator.kube.client import KubeClient
    from pdwarden_operator.watchdog.role_load import RoleLoads

log = logging.getLogger("pdwarden.operator")


@click.group()
def operator() -> None:
    """The pdwarden operator (kopf): reconciles DisaggregatedModels, watches for wedged pods."""


def _optional_module(name: str) -> ModuleType | None:
    """Import a module another part of pdwarden provides, if it exists in this build."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # the module itself is absent: that feature is not built in
        raise  # the module exists but one of ITS imports is missing: a real error


@operator.command()
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    help="Watch only these namespaces (repeatable). A pattern ('team-*') needs namespaces "
    "list and watch cluster-wide: the operator then learns of namespace deletions itself.",
)
@click.option("--all-namespaces", "-A", is_flag=True, help="Watch every namespace (the default without -n).")
@click.option(
    "--metrics-port",
    type=int,
    default=contract.OPERATOR_METRICS_PORT,
    show_default=True,
    help="Port of the operator's own Prometheus metrics (0: off).",
)
@click.option(
    "--health-port",
    type=int,
    default=contract.OPERATOR_HEALTH_PORT,
    show_default=True,
    help="Port of the liveness endpoint /healthz (0: off).",
)
@click.option(
    "--bind-host",
    default="0.0.0.0",
    show_default=True,
    help="Address the metrics and health endpoints listen on.",
)
@click.option(
    "--leader-elect/--no-leader-elect",
    default=True,
    show_default=True,
    help="Act only while holding the leader Lease (a second replica stands by).",
)
@click.option(
    "--leader-election-namespace",
    default=None,
    help="Namespace of the Lease. Default: $POD_NAMESPACE, else the first --namespace, else default.",
)
@click.option(
    "--leader-election-id", default="pdwarden-operator", show_default=True, help="Name of the Lease."
)
@click.option(
    "--brake-max-remediations-per-hour",
    type=click.IntRange(min=1),
    default=DEFAULT_FLEET.max_remediations_per_hour,
    show_default=True,
    help="Fleet brake: remediations across all models per hour, then none.",
)
@click.option(
    "--brake-max-wedged-models",
    type=click.IntRange(min=1),
    default=DEFAULT_FLEET.max_wedged_models,
    show_default=True,
    help="Fleet brake: above this many models with wedged pods at once, remediate none.",
)
@click.option(
    "--brake-max-wedged-pods",
    type=click.IntRange(min=1),
    default=DEFAULT_FLEET.max_wedged_pods,
    show_default=True,
    help="Fleet brake: above this many wedged pods across models at once, remediate none.",
)
@click.option(
    "--brake-min-other-troubled-namespaces",
    type=click.IntRange(min=2),
    default=DEFAULT_FLEET.min_other_troubled_namespaces,
    show_default=True,
    help="Fleet brake: a limit holds a namespace's models only while at least this many other "
    "namespaces contribute to its count: one author's namespaces alone engage only their own brakes.",
)
@click.option(
    "--namespace-brake-max-remediations-per-hour",
    type=click.IntRange(min=1),
    default=DEFAULT_NAMESPACE.max_remediations_per_hour,
    show_default=True,
    help="A namespace's brake: remediations of its models per hour, then none there (below the fleet's).",
)
@click.option(
    "--namespace-brake-max-wedged-models",
    type=click.IntRange(min=1),
    default=DEFAULT_NAMESPACE.max_wedged_models,
    show_default=True,
    help="A namespace's brake: above this many of its models with wedged pods at once, remediate none there.",
)
@click.option(
    "--namespace-brake-max-wedged-pods",
    type=click.IntRange(min=1),
    default=DEFAULT_NAMESPACE.max_wedged_pods,
    show_default=True,
    help="A namespace's brake: above this many wedged pods of its models at once, remediate none there.",
)
@click.option(
    "--allow",
    "allowances",
    multiple=True,
    metavar="[NAMESPACE/]ALLOWANCE",
    help="Let model authors use one power in their pod templates, in every namespace or in "
    "NAMESPACE only (repeatable): " + ", ".join(a.value for a in podpolicy.Allowance) + ". Default: none.",
)
@click.option(
    "--external-metrics-port",
    type=click.IntRange(min=0, max=65535),
    default=0,
    show_default=True,
    help="Serve the external metrics API (each autoscaled role's load, for HPA or KEDA) over "
    "HTTPS on this port while leading (0: off). Needs --external-metrics-tls-dir.",
)
@click.option(
    "--external-metrics-tls-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Directory holding tls.crt and tls.key for the external metrics API.",
)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    metrics_port: int,
    health_port: int,
    bind_host: str,
    leader_elect: bool,
    leader_election_namespace: str | None,
    leader_election_id: str,
    brake_max_remediations_per_hour: int,
    brake_max_wedged_models: int,
    brake_max_wedged_pods: int,
    brake_min_other_troubled_namespaces: int,
    namespace_brake_max_remediations_per_hour: int,
    namespace_brake_max_wedged_models: int,
    namespace_brake_max_wedged_pods: int,
    allowances: tuple[str, ...],
    external_metrics_port: int,
    external_metrics_tls_dir: Path | None,
    verbose: bool,
) -> None:
    """Run the operator until interrupted."""
    _check_options(namespaces, all_namespaces, external_metrics_port, external_metrics_tls_dir)
    pod_policy = _pod_policy(allowances)
    _configure_logging(verbose)
    from pdwarden_operator.metrics import serve as serve_metrics

    context = _operator_context(
        pod_policy,
        partial(
            FleetLimits,
            max_remediations_per_hour=brake_max_remediations_per_hour,
            max_wedged_models=brake_max_wedged_models,
            max_wedged_pods=brake_max_wedged_pods,
            min_other_troubled_namespaces=brake_min_other_troubled_namespaces,
        ),
        partial(
            BrakeLimits,
            max_remediations_per_hour=namespace_brake_max_remediations_per_hour,
            max_wedged_models=namespace_brake_max_wedged_models,
            max_wedged_pods=namespace_brake_max_wedged_pods,
        ),
    )
    handlers = importlib.import_module("pdwarden_operator.handlers")  # registers the reconcile handlers
    handlers.watch_scope(context, list(namespaces))
    if _optional_module("pdwarden_operator.watchdog.kopf_handlers") is None:
        log.warning("watchdog not built in: pods are not scraped for wedges")
    if metrics_port:
        serve_metrics(context.metrics, metrics_port, bind_host)
    if namespaces and not any(handlers.is_glob(ns) for ns in namespaces):
        # Not with globs (`-n 'team-*'`): kopf must list namespaces to resolve them, else it
        # never starts.
        _register_namespace_mode()
    lease_ns = (
        leader_election_namespace
        or os.environ.get(contract.ENV_POD_NAMESPACE)
        or (namespaces[0] if namespaces and not handlers.is_glob(namespaces[0]) else "default")
    )
    _quiet_gc()
    # uvloop, as kopf's own command does when it is installed: a scrape's HTTP request costs
    # a quarter less CPU on it than on asyncio's own loop
    uvloop.run(
        _main(
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            context=context,
            health=(bind_host, health_port) if health_port else None,
            lease=(lease_ns, leader_election_id) if leader_elect else None,
            external_metrics=(
                (bind_host, external_metrics_port, external_metrics_tls_dir)
                if external_metrics_port and external_metrics_tls_dir is not None
                else None
            ),
        )
    )


def _check_options(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    external_metrics_port: int,
    external_metrics_tls_dir: Path | None,
) -> None:
    """Refuse options that exclude or need each other, before anything starts."""
    if namespaces and all_namespaces:
        raise click.UsageError("--namespace and --all-namespaces exclude each other")
    if external_metrics_port and external_metrics_tls_dir is None:
        raise click.UsageError("--external-metrics-port needs --external-metrics-tls-dir (tls.crt, tls.key)")
    if external_metrics_tls_dir is not None:
        missing = [f for f in ("tls.crt", "tls.key") if not (external_metrics_tls_dir / f).is_file()]
        if missing:
            raise click.BadParameter(
                f"{external_metrics_tls_dir} has no {' or '.join(missing)}",
                param_hint="--external-metrics-tls-dir",
            )


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # kopf logs every watch-event handler call at INFO; probes log every request.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _operator_context(
    pod_policy: podpolicy.PodPolicy, fleet: Callable[[], FleetLimits], namespace: Callable[[], BrakeLimits]
) -> OperatorContext:
    """Everything the operator keeps, built once (kopf hands it on as its memo), with the one
    API client connected here. The brakes' limits are built here: limits they or the context
    refuse are a usage error."""
    from pdwarden_operator.context import OperatorContext
    from pdwarden_operator.kube.client import connect

    kube = connect()  # before the try: credentials that cannot be used are no usage error
    try:
        return OperatorContext.build(kube=kube, pod_policy=pod_policy, fleet=fleet(), namespace=namespace())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _register_namespace_mode() -> None:
    """Namespace mode runs on namespaced RBAC (the chart's operator.scope=namespace): tell kopf
    not to list namespaces and CRDs cluster-wide (it retries those 403s for about a minute
    before falling back)."""
    import kopf

    @kopf.on.startup(id="pdwarden-namespace-mode")
    def _namespace_mode(settings: kopf.OperatorSettings, **_: object) -> None:
        settings.scanning.disabled = True


# Allocations between two young-generation collections of the cyclic garbage collector
# (Python's default: 700). Each scrape allocates hundreds of short-lived containers, nearly
# all freed by their reference counts; at the default the collector ran every few scrapes.
GC_YOUNG_THRESHOLD = 50_000


def _quiet_gc() -> None:
    """What start-up built (modules, kopf's registry) is never scanned again, and the young
    generation is collected less often: the collector was a fifth of the operator's CPU."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def _pod_policy(allowances: tuple[str, ...]) -> podpolicy.PodPolicy:
    everywhere: set[podpolicy.Allowance] = set()
    per_namespace: dict[str, set[podpolicy.Allowance]] = {}
    for entry in allowances:
        namespace, _, name = entry.rpartition("/")
        try:
            allowance = podpolicy.Allowance(name)
        except ValueError:
            known = ", ".join(a.value for a in podpolicy.Allowance)
            raise click.BadParameter(f"{name!r} is not one of {known}", param_hint="--allow") from None
        (per_namespace.setdefault(namespace, set()) if namespace else everywhere).add(allowance)
    return podpolicy.PodPolicy(
        allow=frozenset(everywhere), namespaces={ns: frozenset(a) for ns, a in per_namespace.items()}
    )


async def _serve_health(host: str, port: int) -> Any:
    """/healthz for the whole life of the process, standby included (the loop is alive)."""
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def _main(
    *,
    clusterwide: bool,
    namespaces: list[str],
    health: tuple[str, int] | None,
    lease: tuple[str, str] | None,
    context: OperatorContext,
    external_metrics: tuple[str, int, Path] | None = None,
) -> None:
    import kopf

    from pdwarden_operator import leader
    from pdwarden_operator.context import MEMO_KEY

    runner = await _serve_health(*health) if health else None
    elector = None
    if lease is not None:
        # The Lease is renewed on the elector's own thread, loop and connection: nothing the
        # handlers do on this loop (or with the main client's connections) can delay a renewal.
        timing = leader.Timing()
        elector = leader.Elector(
            *lease, timing=timing, metrics=context.metrics, client=leader.lease_client(timing)
        )
        context.watchdog.leadership.elector = elector
        elector.start(on_lost=_step_down)
        await elector.wait_leading()  # a standby does nothing until it holds the Lease
    # kopf names itself after the user unless POD_ID is set; a non-root uid with no passwd
    # entry (a distroless or arbitrary-uid image) has no user name to give.
    os.environ.setdefault("POD_ID", leader.default_identity())
    operator_task = asyncio.create_task(
        kopf.operator(
            standalone=True,
            clusterwide=clusterwide,
            namespaces=namespaces,
            memo=kopf.Memo({MEMO_KEY: context}),  # every object's memo is a copy of this one
        )
    )
    background: set[asyncio.Task[None]] = set()  # held here: the loop keeps only weak references
    metrics_api = (
        await _serve_external_metrics(
            context.kube, *external_metrics, context.watchdog.role_loads, background
        )
        if external_metrics
        else None
    )
    await asyncio.wait({operator_task})
    for task in background:
        task.cancel()
    if metrics_api is not None:
        await metrics_api.cleanup()
    if elector is not None:
        await elector.stop()  # hands the Lease back
    if runner is not None:
        await runner.cleanup()
    context.close()  # the scrape budget's parse workers end
    await operator_task


async def _serve_external_metrics(
    kube: KubeClient,
    host: str,
    port: int,
    tls_dir: Path,
    loads: RoleLoads,
    background: set[asyncio.Task[None]],
) -> Any:
    """The leader's external metrics API, and its pod marked as the one the API's Service
    reaches (a replica that led before keeps the label until this one takes it; the marking
    task is put in `background` while it runs)."""
    from pdwarden_operator import external_metrics
    from pdwarden_operator.kube import pods

    try:
        runner = await external_metrics.serve(kube, host, port, tls_dir, loads)
    except Exception:  # the operator's other work goes on without it
        log.exception("external metrics API not served")
        return None
    pod, namespace = os.environ.get(contract.ENV_POD_NAME), os.environ.get(contract.ENV_POD_NAMESPACE)

    async def mark() -> None:
        assert pod and namespace
        for attempt in range(60):
            try:
                await pods.mark_only(kube, namespace, pod, contract.LABEL_EXTERNAL_METRICS_SERVING)
                return
            except Exception as exc:  # the API may be briefly away; without the label no one reaches us
                log.warning("cannot label pod %s/%s for the external metrics API (%s)", namespace, pod, exc)
                await asyncio.sleep(min(2.0 * (attempt + 1), 10.0))
        log.error("pod %s/%s never got its label: the external metrics API is unreachable", namespace, pod)

    if runner is not None and pod and namespace:
        background.add(task := asyncio.create_task(mark(), name="external-metrics-label"))
        task.add_done_callback(background.discard)
    return runner


def _step_down() -> None:
    """Leadership lost (on the elector's thread). Another replica may lead by now: stop at once,
    mid-anything (every remediation also re-checks the Lease and writes its intent with the
    resourceVersion it read)."""
    log.critical("leadership lost: exiting so that only the current leader acts")
    logging.shutdown()
    os._exit(1)


@click.command()
@click.option("--write", is_flag=True, help="Write crds/ and charts/pdwarden/crds/ instead of printing.")
@click.option("--check", is_flag=True, help="Exit 1 if the files on disk differ from the models.")
@click.option(
    "--apply",
    "apply_",
    is_flag=True,
    help="Write the CRD to the cluster (create or replace; $KUBECONFIG, else in-cluster) and wait until "
    "it is served: what the chart's pre-upgrade hook runs (Helm never upgrades a chart's crds/).",
)
@click.option("--timeout", default=60.0, show_default=True, help="--apply: seconds to wait until served.")
def crd(write: bool, check: bool, apply_: bool, timeout: float) -> None:
    """Print the DisaggregatedModel CRD generated from the pydantic models."""
    from pdwarden_operator import crd as crd_mod

    if sum((write, check, apply_)) > 1:
        raise click.UsageError("--write, --check and --apply exclude each other")
    if apply_:
        _apply_crd(timeout)
        return
    if write:
        for path in crd_mod.write_crds():
            click.echo(f"wrote {path}", err=True)
        return
    if check:
        text = crd_mod.crd_yaml()
        stale = [p for p in crd_mod.crd_paths() if not p.exists() or p.read_text() != text]
        for p in stale:
            click.echo(f"stale: {p} (run `pdwarden crd --write`)", err=True)
        sys.exit(1 if stale else 0)
    click.echo(crd_mod.crd_yaml(), nl=False)


def _apply_crd(timeout: float) -> None:
    from pdwarden_operator.crd_install import CrdNotServed, apply_crd
    from pdwarden_operator.kube.client import KubeApiError, connect
    from pdwarden_operator.kube.credentials import KubeconfigError

    async def run() -> str:
        client = connect()
        try:
            return (await apply_crd(client, timeout)).summary()
        finally:
            await client.aclose()

    try:
        click.echo(asyncio.run(run()))
    except (KubeApiError, CrdNotServed, KubeconfigError) as exc:
        click.echo(f"pdwarden crd --apply: {exc}", err=True)
        sys.exit(1)
