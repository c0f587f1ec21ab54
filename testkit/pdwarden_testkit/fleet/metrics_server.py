"""One HTTP listener in the fleet's namespace answering /metrics for every pod address: the
address a connection came to says which pod, the pod's role and mode which body."""

from __future__ import annotations

import socket
from typing import Final

from aiohttp import web

import pdwarden_contract as contract
from pdwarden_localcluster import network
from pdwarden_runtime.metrics import requested_names
from pdwarden_testkit.fleet.node import FleetNode
from pdwarden_testkit.fleet.runtimes import FleetRuntimes

BACKLOG: Final = 4096  # a round's scrapes of thousands of pods arrive together


def listen(netns: str, port: int) -> socket.socket:
    """A listening socket for [::]:port made inside `netns` (it stays there)."""
    with network.entered(netns):
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("::", port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    return sock


def app(node: FleetNode, runtimes: FleetRuntimes) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        pod = node.pod_at(sockname[0]) if sockname else None
        if pod is None or pod.role not in contract.RUNTIME_ROLES:
            raise web.HTTPNotFound(text="no runtime pod at this address\n")
        body, ctype = runtimes.body(pod.role, pod.mode, tuple(requested_names(request)))
        return web.Response(body=body, headers={"Content-Type": ctype})

    application = web.Application()
    application.router.add_get(contract.METRICS_PATH, metrics)
    return application
