"""A TCP relay that lets pods reach the API server, which listens on the host's loopback only.

Pods live in their own network namespaces, where 127.0.0.1 is their own. The relay listens
on the host's address on the cluster link and copies bytes to the API server's loopback
port; TLS passes through untouched (the serving certificate names that address too).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading

log = logging.getLogger("pdwarden.kubelet")


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve_one(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError as exc:
        log.warning("API relay: cannot reach %s:%d: %s", *target, exc)
        client.close()
        return
    upstream.settimeout(None)
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(listen: tuple[str, int], target: tuple[str, int], stop: threading.Event) -> socket.socket:
    """Start relaying in daemon threads; the listening socket closes when `stop` is set."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(listen)
    server.listen(128)

    def accept_forever() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_serve_one, args=(client, target), daemon=True).start()

    def close_on_stop() -> None:
        stop.wait()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        server.close()

    threading.Thread(target=accept_forever, name="api-relay", daemon=True).start()
    threading.Thread(target=close_on_stop, daemon=True).start()
    return server
