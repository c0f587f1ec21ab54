"""`python -m pdwarden_testkit.fleet --kubeconfig K --network-base B`: run the simulated fleet
until SIGTERM. Prints READY once its node is registered and its pods can be scraped."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

import pdwarden_contract as contract
from pdwarden_localcluster.errors import ClusterError
from pdwarden_localcluster.kubeapi import KubeApi
from pdwarden_localcluster.network import plan
from pdwarden_testkit.fleet import metrics_server, netplumb
from pdwarden_testkit.fleet.addresses import FleetPlan
from pdwarden_testkit.fleet.node import DEFAULT_NAME, FleetNode
from pdwarden_testkit.fleet.runtimes import FleetRuntimes


async def _serve(node: FleetNode, runtimes: FleetRuntimes, fleet: FleetPlan, port: int) -> None:
    runner = web.AppRunner(metrics_server.app(node, runtimes), access_log=None, handle_signals=False)
    await runner.setup()
    await web.SockSite(runner, metrics_server.listen(fleet.netns, port)).start()
    print("READY", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def _run(args: argparse.Namespace, fleet: FleetPlan) -> None:
    netplumb.ensure(fleet)
    runtimes = FleetRuntimes().start()
    api = KubeApi.from_kubeconfig(args.kubeconfig)
    node = FleetNode(api, fleet.pod_pool, name=args.name, capacity=args.capacity)
    try:
        node.start()
        asyncio.run(_serve(node, runtimes, fleet, args.metrics_port))
    finally:
        node.stop()
        runtimes.stop()
        netplumb.teardown(fleet)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdwarden_testkit.fleet", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--network-base", required=True, type=int, help="the local cluster's port base")
    parser.add_argument("--name", default=DEFAULT_NAME)
    parser.add_argument("--capacity", type=int, default=20000, help="pods the node takes")
    parser.add_argument("--metrics-port", type=int, default=contract.DEFAULT_METRICS_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s")
    fleet = FleetPlan(plan(args.network_base))
    try:
        with netplumb.held(fleet):
            _run(args, fleet)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
