"""`pdwarden operator run` and `pdwarden crd`."""

from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType

import click

from pdwarden_runtime import contract

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
    "--namespace", "-n", "namespaces", multiple=True, help="Watch only these namespaces (repeatable)."
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
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def run(
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    metrics_port: int,
    health_port: int,
    bind_host: str,
    verbose: bool,
) -> None:
    """Run the operator until interrupted."""
    if namespaces and all_namespaces:
        raise click.UsageError("--namespace and --all-namespaces exclude each other")
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # kopf logs every watch-event handler call at INFO; probes log every request.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    import kopf

    importlib.import_module("pdwarden_operator.handlers")  # registers the reconcile handlers
    if _optional_module("pdwarden_operator.watchdog.handlers") is None:
        log.warning("watchdog not built in: pods are not scraped for wedges")
    metrics = _optional_module("pdwarden_operator.metrics")
    if metrics is not None and metrics_port:
        metrics.serve(metrics_port, bind_host)
    elif metrics_port:
        log.warning("operator metrics not built in: --metrics-port %d ignored", metrics_port)
    if namespaces and not any(set(ns) & set("*?[!") for ns in namespaces):
        # Namespace mode runs on namespaced RBAC (the chart's operator.scope=namespace): tell
        # kopf not to list namespaces and CRDs cluster-wide (it retries those 403s for about
        # a minute before falling back). Not with globs
        # (`-n 'team-*'`): kopf must list namespaces to resolve them, else it never starts.
        @kopf.on.startup(id="pdwarden-namespace-mode")
        def _namespace_mode(settings: kopf.OperatorSettings, **_: object) -> None:
            settings.scanning.disabled = True

    liveness = f"http://{bind_host}:{health_port}/healthz" if health_port else None
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        liveness_endpoint=liveness,
    )


@click.command()
@click.option("--write", is_flag=True, help="Write crds/ and charts/pdwarden/crds/ instead of printing.")
@click.option("--check", is_flag=True, help="Exit 1 if the files on disk differ from the models.")
def crd(write: bool, check: bool) -> None:
    """Print the DisaggregatedModel CRD generated from the pydantic models."""
    from pdwarden_operator import crd as crd_mod

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
