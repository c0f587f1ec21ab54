"""A busy port is named with what holds it: a listener, or a connection's local end (an
outgoing connection's port from the ephemeral range), established or left half-closed."""

from __future__ import annotations

import os
import socket
import time

import psutil
import pytest

from pdwarden_localcluster import port_holders
from pdwarden_testkit.ports import free_port

pytestmark = pytest.mark.integration


def _me() -> str:
    """This process as the error names it (its name now: a test runner may retitle it)."""
    return f"pid {os.getpid()} ({psutil.Process().name()})"


def test_a_listener_is_named_with_its_process() -> None:
    port = free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert port_holders.describe(port) == [f"{_me()} listens on it"]
    assert port_holders.describe(port) == []


def test_a_connections_local_end_is_named_with_its_peer_until_it_is_closed() -> None:
    port, server_port = free_port(), free_port()
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", server_port))
        server.listen()
        client.bind(("127.0.0.1", port))  # as the kernel binds an outgoing connection's end
        client.connect(("127.0.0.1", server_port))
        accepted, _ = server.accept()
        held = f"{_me()} holds it as the local end of a connection to 127.0.0.1:{server_port}"
        assert port_holders.describe(port) == [f"{held} (ESTABLISHED)"]
        accepted.close()  # the peer goes; the port stays held until this end closes too
        deadline = time.monotonic() + 10
        while "CLOSE_WAIT" not in "".join(port_holders.describe(port)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_holders.describe(port) == [f"{held} (CLOSE_WAIT)"]
        with socket.socket() as late:
            late.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            with pytest.raises(OSError):  # what `up` met: the bind fails while it is held
                late.bind(("127.0.0.1", port))
