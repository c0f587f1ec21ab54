"""The writer watch's fetch of a prefill's identity, against a real HTTP server on loopback: a
redirect, a non-pdwarden answer or a hostile string is no identity; prefills are asked side by
side, so one that does not answer delays no other."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from pdwarden_runtime.hardening.writer_watch import (
    INCARNATION_PATH,
    WriterIdentity,
    WriterWatch,
    fetch_identity,
)

pytestmark = pytest.mark.integration

GOOD = {"incarnation": "0123456789abcdef0123456789abcdef", "pod_uid": "6a1b2c3d-0000-4000-8000-000000000001"}


class _Handler(http.server.BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, dict[str, str], bytes]] = {}
    asked: list[str] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        status, headers, body = self.answers.get(self.path, (404, {}, b""))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("Handler", (_Handler,), {"answers": {}, "asked": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()


def test_a_pdwarden_answer_is_an_identity(server: tuple[str, type[_Handler]]) -> None:
    addr, handler = server
    handler.answers[INCARNATION_PATH] = (200, {}, json.dumps(GOOD).encode())
    assert fetch_identity(addr) == WriterIdentity(GOOD["incarnation"], GOOD["pod_uid"])


def test_a_redirect_is_not_followed(server: tuple[str, type[_Handler]]) -> None:
    addr, handler = server
    handler.answers[INCARNATION_PATH] = (302, {"Location": f"http://{addr}/elsewhere"}, b"")
    handler.answers["/elsewhere"] = (200, {}, json.dumps(GOOD).encode())
    assert fetch_identity(addr) is None
    assert handler.asked == [INCARNATION_PATH]  # the decode never fetched where it was sent


@pytest.mark.parametrize(
    "body",
    [
        {"incarnation": "abc\nWARNING forged log line"},
        {"incarnation": "x" * 65},
        {"incarnation": "NOT-HEX"},
        {"incarnation": ""},
        {"incarnation": 7},
        ["a list"],
    ],
)
def test_an_answer_that_is_not_an_incarnation_is_no_identity(
    server: tuple[str, type[_Handler]], body: object
) -> None:
    addr, handler = server
    handler.answers[INCARNATION_PATH] = (200, {}, json.dumps(body).encode())
    assert fetch_identity(addr) is None


def test_a_hostile_pod_uid_is_dropped_and_the_incarnation_kept(server: tuple[str, type[_Handler]]) -> None:
    addr, handler = server
    handler.answers[INCARNATION_PATH] = (200, {}, json.dumps({**GOOD, "pod_uid": "uid\r\nx"}).encode())
    assert fetch_identity(addr) == WriterIdentity(GOOD["incarnation"], None)


class _NoHeld:
    def held_addresses(self) -> list[str]:
        return []

    def observe(self, addr: str, identity: WriterIdentity, asked_at: float) -> None:
        raise AssertionError("nothing is held")

    def observe_gone_pods(self, gone: object) -> None:
        raise AssertionError("nothing is held")


def test_prefills_are_asked_side_by_side() -> None:
    """The fetch of the prefill that hangs waits until another prefill has been asked: asked one
    after the other, the probe would never get there (the wait fails after 10 s instead)."""
    second_asked = threading.Event()

    def fetch(addr: str) -> WriterIdentity | None:
        if addr == "198.18.0.1:8998":
            assert second_asked.wait(10), "the second prefill was not asked while the first hung"
            return None
        second_asked.set()
        return WriterIdentity("ab")

    watch = WriterWatch(_NoHeld(), lambda: ["198.18.0.1:8998", "198.18.0.2:8998"], fetch=fetch)
    try:
        watch.probe_once()
    finally:
        watch.stop()
    assert watch.identity("198.18.0.2:8998") == WriterIdentity("ab")
    assert watch.identity("198.18.0.1:8998") is None
