"""The autoscale bench's router clients: a failed request is reported with its cause, and a
client entered again sends again (bring-up retries until the router answers; an entry that sent
nothing left the first failure standing for the whole wait)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from pdwarden_bench.autoscale import RouterClients, send_one
from pdwarden_localcluster.waits import wait_for

pytestmark = pytest.mark.unit


class _Answers(http.server.BaseHTTPRequestHandler):
    """503 for the first `failing` requests, 200 after."""

    failing = 0
    seen = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            type(self).seen += 1
            status = 503 if type(self).seen <= type(self).failing else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Answers]]]:
    handler = type("Answers", (_Answers,), {"failing": 1, "seen": 0, "lock": threading.Lock()})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/generate", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_failed_request_names_its_cause_and_the_next_one_is_answered(
    server: tuple[str, type[_Answers]],
) -> None:
    url, _ = server
    error = send_one(url, "m")
    assert error is not None and "503" in error
    assert send_one(url, "m") is None


def test_clients_entered_again_send_again(server: tuple[str, type[_Answers]]) -> None:
    url, handler = server
    clients = RouterClients(url, "m", 1, active=1)
    for entry in range(2):
        with clients:
            wait_for(lambda: any(ok for *_, ok in clients.results), 10, f"an answer in entry {entry}", 0.05)
        answered = sum(1 for *_, ok in clients.results if ok)
        clients.results.clear()
        assert answered >= 1
    seen = handler.seen
    time.sleep(0.3)
    assert handler.seen == seen, "a client sent after its exit"
