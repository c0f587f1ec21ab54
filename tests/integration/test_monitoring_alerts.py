"""Reading Alertmanager's API (pdwarden_localcluster.monitoring.alerts) from a real HTTP server:
its filter goes out as Alertmanager's matchers, and an answer that is not a list of alerts is a
clear ClusterError, never a crash."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from pdwarden_localcluster import monitoring
from pdwarden_localcluster.errors import ClusterError

pytestmark = pytest.mark.integration

ALERT = {
    "labels": {"alertname": "PdwardenInflightStuck", "namespace": "models", "pod": "m-prefill-a"},
    "annotations": {"summary": "stuck"},
    "startsAt": "2026-12-02T00:00:10.123Z",
    "endsAt": "2026-12-02T00:04:10.123Z",
    "fingerprint": "abc123",
    "status": {"state": "active", "silencedBy": [], "inhibitedBy": []},
    "receivers": [{"name": "null"}],
}


class Server:
    def __init__(self) -> None:
        self.answer: tuple[int, bytes] = (200, b"[]")
        self.queries: list[dict[str, list[str]]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.queries.append(parse_qs(urlsplit(self.path).query))
                status, body = owner.answer
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def test_alerts_are_read_with_the_filter_sent_as_matchers(server: Server) -> None:
    server.answer = (200, json.dumps([ALERT]).encode())
    (alert,) = monitoring.alerts(server.url, namespace="models", pod="m-prefill-a")
    assert alert.name == "PdwardenInflightStuck" and alert.labels["pod"] == "m-prefill-a"
    assert alert.state == "active" and alert.starts_at == ALERT["startsAt"]
    assert server.queries[-1]["filter"] == ['namespace="models"', 'pod="m-prefill-a"']


@pytest.mark.parametrize(
    "answer",
    [
        (200, b"not json"),
        (200, b'{"alerts": []}'),
        (200, json.dumps([{"labels": "x"}]).encode()),
        (200, json.dumps([1, 2]).encode()),
        (500, b"[]"),
    ],
    ids=["not-json", "not-a-list", "bad-labels", "not-objects", "server-error"],
)
def test_an_answer_that_is_not_a_list_of_alerts_is_a_clear_error(
    server: Server, answer: tuple[int, bytes]
) -> None:
    server.answer = answer
    with pytest.raises(ClusterError, match="Alertmanager at"):
        monitoring.alerts(server.url)


def test_an_alertmanager_that_does_not_answer_is_a_clear_error() -> None:
    with pytest.raises(ClusterError, match="did not answer"):
        monitoring.alerts("http://127.0.0.1:9", timeout=2.0)
