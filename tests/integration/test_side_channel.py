"""The PD side channel against a stranger, for real: synthetic prefill and decode processes
started by the project's launcher, with and without the model's worker key.

A stranger (no key) cannot register a prefill rank, cannot read a rank's side-channel address,
and cannot end or confuse the prefill's NIXL bootstrap thread with ZMQ messages: whatever it
pushes is dropped and counted, the thread stays alive, and the pair still serves. Without a
key, a malformed message is dropped and counted all the same. A fake prefill (a bootstrap
server that answers anyone) named as the prefill of requests sent to the keyed decode gets
neither its registration nor any room's pages: those requests fail at once.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import zmq
from aiohttp import web

import pdwarden_contract as c
from pdwarden_bench.pdclient import COMPLETED, Endpoint, pd_request
from pdwarden_localcluster.waits import wait_for
from pdwarden_runtime.hardening.bootstrap_guard import (
    ANSWER_PROOF_HEADER,
    PROOF_HEADER,
    route_answer_proof,
    route_read_proof,
)
from pdwarden_runtime.hardening.side_channel import SideKey
from pdwarden_runtime.worker_key import read_key_file
from pdwarden_testkit.ports import free_port
from pdwarden_testkit.promtext import metric_sum, samples
from pdwarden_testkit.runtime_procs import Fleet, Runtime, http_post_json, serve_flags, wait_healthy

pytestmark = pytest.mark.integration

FLAGS = serve_flags(inflight_deadline=60)
GUARD = b"NixlMsgGuard"  # SGLang's NIXL message guard (nixl/conn.py)
RANK_QUERY = "prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"
SUMMARY_QUERY = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
STRANGER_RANK = {
    "attn_tp_size": 1,
    "attn_tp_rank": 0,
    "attn_cp_size": 1,
    "attn_cp_rank": 0,
    "attn_dp_size": 1,
    "attn_dp_rank": 0,
    "pp_size": 1,
    "pp_rank": 0,
    "system_dp_size": 1,
    "system_dp_rank": 0,
    "rank_ip": "127.0.0.2",
    "rank_port": 1,
    "page_size": 16,
    "kv_cache_dtype": "auto",
}


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("worker-key") / c.WORKER_KEY_SECRET_KEY
    path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


@pytest.fixture(scope="module")
def side_key(key_file: Path) -> SideKey:
    return SideKey.derive(read_key_file(key_file))


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with Fleet() as f:
        yield f


@pytest.fixture(scope="module")
def pair(fleet: Fleet, key_file: Path) -> tuple[Runtime, Runtime]:
    prefill = fleet.runtime(c.ROLE_PREFILL, extra=FLAGS, worker_key_file=key_file)
    decode = fleet.runtime(c.ROLE_DECODE, extra=FLAGS, worker_key_file=key_file)
    wait_healthy([prefill, decode], timeout=300)
    return prefill, decode


@pytest.fixture(scope="module")
def keyless_prefill(fleet: Fleet) -> Runtime:
    prefill = fleet.runtime(c.ROLE_PREFILL, extra=FLAGS)
    wait_healthy([prefill], timeout=300)
    return prefill


def _route(
    rt: Runtime,
    method: str,
    query: str = "",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    url = f"http://{rt.host}:{rt.bootstrap_port}/route" + (f"?{query}" if query else "")
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def _rank(prefill: Runtime, key: SideKey) -> dict[str, object]:
    status, text = _route(prefill, "GET", RANK_QUERY, headers={PROOF_HEADER: route_read_proof(key)})
    assert status == 200, text
    rank: dict[str, object] = json.loads(text)
    return rank


def _side_errors(rt: Runtime) -> float:
    found = samples(rt.metrics())
    return metric_sum(found, c.METRIC_RUNTIME_ERRORS_TOTAL, role=rt.role, where="side_channel")


def _bootstrap_threads(rt: Runtime) -> float:
    found = samples(rt.metrics())
    return metric_sum(found, c.METRIC_RUNTIME_THREADS, thread=c.THREAD_NIXL_BOOTSTRAP)


def _push(port: int, *messages: list[bytes]) -> None:
    """What a stranger does: connect to the rank's ZMQ port and push messages."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        for message in messages:
            sock.send_multipart(message)
    finally:
        sock.close(linger=5000)  # until they are delivered
        ctx.term()


def _stranger_registration() -> list[bytes]:
    """A registration in SGLang's layout (room None) whose agent metadata is not NIXL's."""
    return [
        GUARD,
        b"None",
        b"127.0.0.2",
        b"1",
        b"stranger-agent",
        b"not an agent's metadata",
        struct.pack("Q", 0x1000),  # KV base pointers
        b"",  # aux pointers
        b"",  # state pointers
        b"0",  # gpu id
        b"1",  # decode TP size
        b"0",  # decode TP rank
        b"65536",  # KV item length
    ]


def _stranger_metadata(room: int) -> list[bytes]:
    """A room's transfer info in SGLang's layout, naming the stranger's agent and pages."""
    return [
        GUARD,
        str(room).encode(),
        b"127.0.0.2",
        b"1",
        b"stranger-agent",
        struct.pack("2i", 0, 1),
        b"0",
        b"1",
        b"",
        b"0",
        b"0",
    ]


async def _one_request(prefill: Runtime, decode: Runtime) -> str:
    endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)
    async with aiohttp.ClientSession(headers=decode.headers) as session:
        outcome, answer = await pd_request(
            session, endpoint, random.getrandbits(62), prompt_tokens=48, timeout=60
        )
    assert outcome == COMPLETED, answer
    return outcome


def test_a_stranger_can_neither_register_a_rank_nor_read_ones_address(
    pair: tuple[Runtime, Runtime], side_key: SideKey
) -> None:
    prefill, _ = pair
    before = _rank(prefill, side_key)
    assert before["rank_ip"] == prefill.host
    body = json.dumps(STRANGER_RANK).encode()
    json_header = {"Content-Type": "application/json"}
    status, text = _route(prefill, "PUT", body=body, headers=json_header)
    assert status == 403 and "proof" in text
    forged = SideKey.derive("another model's key, not this one").http_proof("PUT", "/route", body)
    assert _route(prefill, "PUT", body=body, headers={**json_header, PROOF_HEADER: forged})[0] == 403
    # a key holder's registration of an address that is not this pod's is refused too
    signed = side_key.http_proof("PUT", "/route", body)
    status, text = _route(prefill, "PUT", body=body, headers={**json_header, PROOF_HEADER: signed})
    assert status == 403 and "own pod" in text
    # the rank's address only with the proof; the summary names no address
    assert _route(prefill, "GET", RANK_QUERY)[0] == 403
    wrong = {PROOF_HEADER: route_read_proof(SideKey.derive("another model's key, not this one"))}
    assert _route(prefill, "GET", RANK_QUERY, headers=wrong)[0] == 403
    status, text = _route(prefill, "GET", SUMMARY_QUERY)
    assert status == 200 and "rank_ip" not in text and "rank_port" not in text
    assert _rank(prefill, side_key) == before  # the table is as the prefill registered it


def test_stranger_frames_are_dropped_and_counted_and_the_bootstrap_thread_lives(
    pair: tuple[Runtime, Runtime], side_key: SideKey
) -> None:
    prefill, decode = pair
    asyncio.run(_one_request(prefill, decode))  # the decode registered with the prefill
    port = int(str(_rank(prefill, side_key)["rank_port"]))
    errors = _side_errors(prefill)
    assert _bootstrap_threads(prefill) == 1
    stranger = SideKey.derive("another model's key, not this one")
    sent = [
        [b"x"],
        _stranger_registration(),
        _stranger_metadata(7),
        stranger.sign(_stranger_registration()),
        [*side_key.sign(_stranger_metadata(8))[:-1], b"\0" * 16],  # the proof replaced
    ]
    _push(port, *sent)
    wait_for(
        lambda: _side_errors(prefill) >= errors + len(sent),
        60,
        "the prefill to count the stranger's messages",
        0.5,
    )
    assert _bootstrap_threads(prefill) == 1
    state = prefill.state()
    assert state["sglang_threads"]["bootstrap_thread_guarded"] == 1
    assert "7" not in state["room_list"] and "8" not in state["room_list"]  # no room opened for them
    asyncio.run(_one_request(prefill, decode))  # and the pair still serves


def test_without_a_key_a_malformed_frame_no_longer_kills_the_bootstrap_thread(
    keyless_prefill: Runtime,
) -> None:
    prefill = keyless_prefill
    status, text = _route(prefill, "GET", RANK_QUERY)  # no key: nothing to prove
    assert status == 200, text
    port = int(json.loads(text)["rank_port"])
    # still: only this pod's ranks register with it
    body = json.dumps(STRANGER_RANK).encode()
    assert _route(prefill, "PUT", body=body, headers={"Content-Type": "application/json"})[0] == 403
    assert json.loads(_route(prefill, "GET", RANK_QUERY)[1])["rank_port"] == port
    errors = _side_errors(prefill)
    assert _bootstrap_threads(prefill) == 1
    sent = [[b"x"], [GUARD], [GUARD, b"not-a-room", b"a", b"b", b"c"], _stranger_registration()]
    _push(port, *sent)
    wait_for(lambda: _side_errors(prefill) >= errors + len(sent), 60, "the prefill to count the frames", 0.5)
    assert _bootstrap_threads(prefill) == 1
    assert prefill.state()["sglang_threads"]["bootstrap_thread_guarded"] == 1


# The fake prefill's address: another loopback address, so the decode's figures for it (by
# IP) are its own, not the real prefill's.
FAKE_HOST = "127.0.0.2"


class FakePrefill:
    """A bootstrap server that answers anyone (it takes whatever request proof comes): the
    summary it copies from the real prefill, and for a rank its own ZMQ socket, which records
    whatever a decode sends it. Its answers carry no proof, or one made with another key."""

    def __init__(self, summary: str) -> None:
        self.summary = summary
        self.rank_asks = 0
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.zmq_port = self.pull.bind_to_random_port(f"tcp://{FAKE_HOST}")
        self.port = free_port(FAKE_HOST)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _route(self, request: web.Request) -> web.Response:
        if request.query.get("target_tp_rank") == "-1":
            return web.Response(text=self.summary, content_type="application/json")
        self.rank_asks += 1
        body = json.dumps({"rank_ip": FAKE_HOST, "rank_port": self.zmq_port}).encode()
        headers = {}
        if self.rank_asks % 2 == 0:  # a proof, of another model's key
            headers[ANSWER_PROOF_HEADER] = route_answer_proof(SideKey.derive("another model's key"), body)
        return web.Response(body=body, content_type="application/json", headers=headers)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/route", self._route)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, FAKE_HOST, self.port).start())
        self._started.set()
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        assert self._started.wait(30)

    def received(self, wait_ms: int) -> list[list[bytes]]:
        """What decodes sent its rank, waiting up to ``wait_ms`` for a first message."""
        got: list[list[bytes]] = []
        while self.pull.poll(wait_ms if not got else 0):
            got.append(self.pull.recv_multipart())
        return got

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self.pull.close(linger=0)
        self.ctx.term()


@pytest.fixture
def fake_prefill(pair: tuple[Runtime, Runtime]) -> Iterator[FakePrefill]:
    prefill, _ = pair
    status, summary = _route(prefill, "GET", SUMMARY_QUERY)
    assert status == 200, summary
    fake = FakePrefill(summary)
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


def _refused(rt: Runtime, peer: str) -> float:
    found = samples(rt.metrics())
    return metric_sum(
        found, c.METRIC_KV_WRITER_REFUSED_TOTAL, peer=peer, reason=c.WRITER_REFUSED_UNPROVEN_ROUTE
    )


def test_a_keyed_decode_publishes_nothing_to_a_prefill_that_cannot_prove_the_key(
    pair: tuple[Runtime, Runtime], fake_prefill: FakePrefill
) -> None:
    prefill, decode = pair
    errors = _side_errors(decode)
    requests = 4
    for _ in range(requests):  # as a router made to name the fake would send them
        body = {
            "text": "a request routed to a fake prefill",
            "sampling_params": {"max_new_tokens": 2},
            "bootstrap_host": FAKE_HOST,
            "bootstrap_port": fake_prefill.port,
            "bootstrap_room": random.getrandbits(62),
        }
        # fails at once: well inside the client's timeout, far inside the inflight deadline
        status, answer = http_post_json(
            f"{decode.url}{c.GENERATE_PATH}", body, timeout=30, headers=decode.headers
        )
        assert status == 500 and "bootstrap info" in str(answer), (status, answer)
    assert fake_prefill.rank_asks == requests  # the decode asked, and took no answer
    assert fake_prefill.received(wait_ms=2000) == []  # no registration, no metadata: no pages
    state = decode.state()
    assert [h for h in state["held_rooms"] if h["peer"] == FAKE_HOST] == []
    assert state["writer_refusals"][c.WRITER_REFUSED_UNPROVEN_ROUTE] >= requests
    assert state["pending_requests"] == 0 and state["free_pages"] == state["total_pages"]
    assert _refused(decode, FAKE_HOST) >= requests
    assert _side_errors(decode) >= errors + requests
    asyncio.run(_one_request(prefill, decode))  # the real keyed pair still serves
