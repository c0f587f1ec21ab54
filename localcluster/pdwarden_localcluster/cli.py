"""`pdwarden cluster up|down|status|kubeconfig|logs`: the embedded local cluster."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from pdwarden_localcluster import cluster as local
from pdwarden_localcluster import monitoring as monitoring_stack
from pdwarden_localcluster import topology
from pdwarden_localcluster.errors import ClusterError

F = TypeVar("F", bound=Callable[..., Any])


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def friendly(fn: F) -> F:
    """Problems the user can fix print as one clear message, never a stack trace."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # SIGTERM unwinds like Ctrl-C, so whatever was started (a build, a half-up cluster) is stopped
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            return fn(*args, **kwargs)
        except ClusterError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper  # type: ignore[return-value]


@click.group()
def cluster() -> None:
    """The embedded local Kubernetes (real apiserver, controller-manager, scheduler; process kubelet)."""


@cluster.command()
@click.option(
    "--nodes",
    type=int,
    default=None,
    help="Nodes the process kubelet registers "
    f"[default: $PDWARDEN_CLUSTER_NODES or {topology.DEFAULT_NODES}].",
)
@click.option(
    "--cpu-nodes",
    type=int,
    default=None,
    help="How many of them are untainted CPU-only nodes; the rest are tainted GPU nodes "
    f"[default: $PDWARDEN_CLUSTER_CPU_NODES or {topology.DEFAULT_CPU_NODES}].",
)
@click.option(
    "--gpus",
    default=topology.DEFAULT_GPUS,
    show_default=True,
    help="nvidia.com/gpu capacity of each GPU node.",
)
@click.option(
    "--monitoring",
    is_flag=True,
    help="Also run prometheus-operator, Prometheus and Alertmanager (namespace monitoring), which "
    "pick up every PodMonitor, ServiceMonitor and PrometheusRule.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what runs as one JSON line.")
@friendly
def up(nodes: int | None, cpu_nodes: int | None, gpus: int, monitoring: bool, as_json: bool) -> None:
    """Build if needed, start the cluster (or reuse the running one) and wait for its nodes Ready."""
    progress = lambda m: click.echo(m, err=True)  # noqa: E731
    info = local.ensure_up(nodes=nodes, gpus=gpus, cpu_nodes=cpu_nodes, progress=progress)
    stack = monitoring_stack.ensure_monitoring(info.kubeconfig, progress) if monitoring else None
    if as_json:
        doc = info.as_dict()
        if stack is not None:
            doc["monitoring"] = stack.as_dict()
        click.echo(json.dumps(doc))
        return
    verb = f"started in {info.seconds:.1f}s" if info.started else "already running"
    click.echo(f"local cluster {verb}: Kubernetes {info.kubernetes_version} at {info.server}")
    for name, pid in info.processes.items():
        click.echo(f"  {name:<24} pid {pid}")
    click.echo(f"  nodes: {', '.join(info.nodes)}")
    click.echo(f"kubeconfig: {info.kubeconfig}")
    click.echo(f"  export KUBECONFIG={info.kubeconfig}")
    if stack is not None:
        click.echo(f"monitoring ready in {stack.seconds:.1f}s")
        click.echo(f"  Prometheus   {stack.prometheus_url}")
        click.echo(f"  Alertmanager {stack.alertmanager_url}")


@cluster.command()
@friendly
def down() -> None:
    """Stop every process the cluster started, pod processes included."""
    local.down(progress=lambda m: click.echo(m))


@cluster.command()
@click.option("--json", "as_json", is_flag=True)
@friendly
def status(as_json: bool) -> None:
    """Say what runs."""
    info = local.status()
    if as_json:
        click.echo(json.dumps(info))
        return
    click.echo(
        f"local cluster: {'running' if info['running'] else 'not running'} (state {info['state_dir']})"
    )
    for name, comp in info["components"].items():
        state = f"pid {comp['pid']}" if comp["running"] else "stopped"
        click.echo(f"  {name:<24} {state}")
    if info["running"]:
        version = info.get("server_version", "?")
        click.echo(f"  server {info['server']} ({version}), nodes: {', '.join(info['nodes'])}")
        click.echo(f"kubeconfig: {info['kubeconfig']}")
    if not info["running"]:
        sys.exit(1)


@cluster.command()
def kubeconfig() -> None:
    """Print the path of the admin kubeconfig."""
    click.echo(str(local.layout().kubeconfig))


@cluster.command()
@click.argument("pod")
@click.option("-n", "--namespace", default="default", show_default=True)
@click.option("-c", "--container", default=None, help="Container name (needed when the pod has several).")
@friendly
def logs(pod: str, namespace: str, container: str | None) -> None:
    """Print a pod container's log (kept by the process kubelet)."""
    path = container_log(pod, namespace, container)
    sys.stdout.write(path.read_text(errors="replace"))


def container_log(pod: str, namespace: str, container: str | None) -> Path:
    """The log file of a pod's container; the newest pod of that name wins."""
    dirs = sorted(
        local.layout().pods.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    if not dirs:
        raise ClusterError(f"no pod {namespace}/{pod} has run on the local cluster (try -n NAMESPACE)")
    logs = sorted(dirs[0].glob("*.log"))
    if container is not None:
        chosen = [p for p in logs if p.stem == container]
        if not chosen:
            names = ", ".join(p.stem for p in logs)
            raise ClusterError(f"pod {namespace}/{pod} has no container {container!r} (containers: {names})")
        return chosen[0]
    if len(logs) != 1:
        names = ", ".join(p.stem for p in logs) or "none started yet"
        raise ClusterError(f"pod {namespace}/{pod} has several containers, choose one with -c: {names}")
    return logs[0]
