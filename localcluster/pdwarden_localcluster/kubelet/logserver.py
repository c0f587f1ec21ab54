"""The kubelet's HTTPS endpoint, enough for `kubectl logs` (the apiserver proxies to it).

Serves `GET /containerLogs/{namespace}/{pod}/{container}` (tailLines, follow, limitBytes)
from the log files the pod workers write, and `/healthz`. `/exec/...` and `/portForward/...`
(SPDY or WebSocket upgrades from the apiserver) are relayed byte for byte to the streaming
server (pdwarden-streaming, on loopback), which speaks those protocols with the kubelet's own
library. Listens on loopback only; the apiserver does not verify kubelet certificates here,
so the serving certificate is self-signed and made at start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import logging
import select
import socket
import ssl
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger("pdwarden.kubelet")


def find_log(pods_dir: Path, namespace: str, pod: str, container: str) -> Path | None:
    dirs = sorted(pods_dir.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for directory in dirs:
        path = directory / f"{container}.log"
        if path.exists():
            return path
    return None


MARKER = b"--- pdwarden kubelet: "
START_MARKER = MARKER + b"starting "


def select_run(data: bytes, previous: bool) -> bytes:
    """The current (or previous) container run's output, without the kubelet's marker lines.

    The log file keeps every run, each opened by a start marker; `kubectl logs` shows one run.
    """
    runs: list[list[bytes]] = [[]]
    for line in data.splitlines(keepends=True):
        if line.startswith(START_MARKER):
            runs.append([])
        elif not line.startswith(MARKER):
            runs[-1].append(line)
    if previous:
        return b"".join(runs[-2]) if len(runs) >= 3 else b""
    return b"".join(runs[-1])


def strip_markers(data: bytes) -> bytes:
    return b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(MARKER))


def tail(data: bytes, lines: int | None) -> bytes:
    if lines is None:
        return data
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


STREAMING_PATHS = ("exec", "attach", "portForward")


def relay(client: socket.socket, upstream: socket.socket, stop: threading.Event) -> None:
    """Copy bytes both ways until the upstream side ends, in one thread.

    One thread, not two: a TLS socket must not be read and written from two threads at once.
    """
    client_open = True
    while not stop.is_set():
        pending = isinstance(client, ssl.SSLSocket) and client_open and client.pending() > 0
        watch = [upstream] + ([client] if client_open else [])
        readable = watch if pending else select.select(watch, [], [], 1.0)[0]
        for sock in readable:
            try:
                data = sock.recv(65536)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            except OSError:
                data = b""
            if sock is upstream:
                if not data:
                    return
                client.sendall(data)
            elif data:
                upstream.sendall(data)
            else:  # the client is done sending; keep passing the answer back
                client_open = False
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)


class _Handler(BaseHTTPRequestHandler):
    pods_dir: Path
    stop: threading.Event
    streaming: tuple[str, int] | None = None

    def log_message(self, format: str, *args: object) -> None:
        log.debug("kubelet api: " + format, *args)

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            self._reply(200, b"ok")
        elif len(parts) == 4 and parts[0] == "containerLogs":
            self._logs(parts[1], parts[2], parts[3], query)
        elif parts and parts[0] in STREAMING_PATHS:
            self._relay()
        else:
            self._reply(404, b"not found\n")

    def do_POST(self) -> None:
        if urllib.parse.urlsplit(self.path).path.strip("/").split("/")[0] in STREAMING_PATHS:
            self._relay()
        else:
            self._reply(404, b"not found\n")

    def _relay(self) -> None:
        """Hand the request (an upgrade to SPDY or WebSocket) to the streaming server."""
        self.close_connection = True
        if self.streaming is None:
            self._reply(
                501, b"the kubelet's streaming server is not running: exec and port-forward are off\n"
            )
            return
        try:
            upstream = socket.create_connection(self.streaming, timeout=10)
        except OSError as exc:
            self._reply(502, f"the kubelet's streaming server does not answer: {exc}\n".encode())
            return
        upstream.settimeout(None)
        head = f"{self.command} {self.path} {self.request_version}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()) + "\r\n"
        with upstream:
            upstream.sendall(head.encode("latin-1"))
            relay(self.connection, upstream, self.stop)

    def _reply(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _logs(self, namespace: str, pod: str, container: str, query: dict[str, list[str]]) -> None:
        path = find_log(self.pods_dir, namespace, pod, container)
        if path is None:
            self._reply(404, f"no log for container {container} of pod {namespace}/{pod}\n".encode())
            return
        tail_lines = int(query["tailLines"][0]) if "tailLines" in query else None
        limit = int(query["limitBytes"][0]) if "limitBytes" in query else None
        follow = query.get("follow", ["false"])[0] == "true"
        previous = query.get("previous", ["false"])[0] == "true"
        data = tail(select_run(path.read_bytes(), previous), tail_lines)
        if limit is not None:
            data = data[:limit]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        if not follow or previous:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.end_headers()
        self.wfile.write(data)
        self._follow(path, path.stat().st_size)

    def _follow(self, path: Path, offset: int) -> None:
        pid_file = path.with_suffix(".pid")
        idle_since = time.monotonic()
        try:
            while not self.stop.is_set():
                size = path.stat().st_size if path.exists() else offset
                if size > offset:
                    with path.open("rb") as fh:
                        fh.seek(offset)
                        chunk = fh.read(size - offset)
                    offset = size
                    self.wfile.write(strip_markers(chunk))
                    self.wfile.flush()
                    idle_since = time.monotonic()
                elif not pid_file.exists() and time.monotonic() - idle_since > 2.0:
                    return  # the container has ended and everything was sent
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError, OSError):
            return


def serve(
    port: int,
    pods_dir: Path,
    pki_dir: Path,
    stop: threading.Event,
    streaming: tuple[str, int] | None = None,
) -> ThreadingHTTPServer:
    """Start the endpoint in a daemon thread; returns the server (call shutdown() to stop)."""
    attrs = {"pods_dir": pods_dir, "stop": stop, "streaming": streaming}
    handler = type("Handler", (_Handler,), attrs)
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    cert, key = self_signed(pki_dir, "kubelet-serving")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    # the handshake runs in the handler thread, so a slow client cannot stall accept()
    server.socket = ctx.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name=f"kubelet-api-{port}", daemon=True).start()
    return server
