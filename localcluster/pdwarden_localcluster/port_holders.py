"""Who holds a local port: the words `up` gives when one of the cluster's ports will not bind.

A port is busy either because a process listens on it or because a connection's local end
holds it (an outgoing connection gets its local port from the kernel's ephemeral range, and
holds it, established or half-closed, until that process closes the socket). The two call for
different remedies, so the error says which.
"""

from __future__ import annotations

import psutil

# Addresses whose socket keeps a bind to 127.0.0.1:<port> from succeeding.
_CLASHING = frozenset({"127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"})


def _process(pid: int | None) -> str:
    if pid is None:
        return "a socket of no process this user can see"
    try:
        return f"pid {pid} ({psutil.Process(pid).name()})"
    except psutil.Error:
        return f"pid {pid} (gone)"


def describe(port: int) -> list[str]:
    """One phrase per socket bound to `port` where a bind to 127.0.0.1 clashes with it."""
    try:
        sockets = psutil.net_connections(kind="tcp")
    except psutil.Error:  # no permission to list them: say nothing rather than guess
        return []
    found = []
    for conn in sockets:
        if not conn.laddr or conn.laddr.port != port or conn.laddr.ip not in _CLASHING:
            continue
        who = _process(conn.pid)
        if conn.status == psutil.CONN_LISTEN:
            found.append(f"{who} listens on it")
        elif conn.raddr:
            found.append(
                f"{who} holds it as the local end of a connection to "
                f"{conn.raddr.ip}:{conn.raddr.port} ({conn.status})"
            )
        else:
            found.append(f"{who} has it bound ({conn.status})")
    return sorted(set(found))
