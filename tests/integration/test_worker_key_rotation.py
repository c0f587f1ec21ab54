"""Workers of neighbouring key uses serve each other for real: what the operator's plan
(`worker_key_secret.step`) relies on while the model's key is switched on or off or rotates.

Synthetic prefills and decodes as processes, each started as the operator renders a worker at
some step (`--worker-key-file`, `--worker-key-accept-file`, `--side-channel-lenient`), and PD
requests between them with the key the router presents at that step. Pairs the plan puts side
by side complete; pairs it never puts side by side are refused (the checks are real).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

import pdwarden_contract as c
from pdwarden_bench.pdclient import COMPLETED, Endpoint, pd_request
from pdwarden_testkit.runtime_procs import (
    Fleet,
    Runtime,
    http_status,
    new_key_file,
    serve_flags,
    wait_healthy,
)

pytestmark = pytest.mark.integration

# A refused pair fails at once (an unproven route answer) or at this deadline (dropped frames).
FLAGS = serve_flags(inflight_deadline=6)
FLAG = c.ServeFlag

# (name, the key file it uses, the one it accepts too, lenient): the worker uses of the plan.
USES: dict[str, tuple[str | None, str | None, bool]] = {
    "none": (None, None, False),  # no key: before a switch on, after a switch off
    "a-lenient": ("a", None, True),  # the key switched on (or off) while others have none
    "a": ("a", None, False),  # the key in force
    "a-accepts-b": ("a", "b", False),  # a rotation to b begins
    "b-accepts-a": ("b", "a", False),  # a rotation to b: signing with b
}
# (prefill use, decode use, whether they serve each other); a PD request carries the side
# channel both ways (registration and metadata to the prefill; route answers, status and
# drain ACKs to the decode).
PAIRS = [
    ("a-lenient", "none", True),  # the key switched on: a decode without it yet, and back
    ("a-lenient", "a", True),  # lenient beside strict
    ("b-accepts-a", "a-accepts-b", True),  # a rotation's middle
    ("b-accepts-a", "a", False),  # never side by side: a decode of `a` takes no proof of b
    ("none", "a", False),  # never side by side: `a` requires proofs
]
ROOMS = itertools.count(8_500_001)


@pytest.fixture(scope="module")
def key_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: new_key_file(tmp_path_factory.mktemp(f"key-{name}")) for name in ("a", "b")}


def _flags(use: str, key_files: dict[str, Path]) -> list[str]:
    sign, accept, lenient = USES[use]
    flags = [] if sign is None else [FLAG.WORKER_KEY_FILE, str(key_files[sign])]
    flags += [] if accept is None else [FLAG.WORKER_KEY_ACCEPT_FILE, str(key_files[accept])]
    return flags + ([FLAG.SIDE_CHANNEL_LENIENT] if lenient else [])


@pytest.fixture(scope="module")
def workers(key_files: dict[str, Path]) -> Iterator[dict[tuple[str, str], Runtime]]:
    """Every (role, use) that PAIRS names, started side by side."""
    wanted = {(c.ROLE_PREFILL, p) for p, _, _ in PAIRS} | {(c.ROLE_DECODE, d) for _, d, _ in PAIRS}
    with Fleet() as fleet:
        started = {
            (role, use): fleet.runtime(role, extra=[*FLAGS, *_flags(use, key_files)])
            for role, use in sorted(wanted)
        }
        wait_healthy(list(started.values()), timeout=300)
        yield started


def _request(prefill: Runtime, decode: Runtime, key: str) -> str:
    endpoint = Endpoint(prefill.url, decode.url, prefill.host, prefill.bootstrap_port)

    async def one() -> str:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
            outcome, _ = await pd_request(session, endpoint, next(ROOMS), prompt_tokens=64, timeout=30)
            return outcome

    return asyncio.run(one())


def _key(path: Path) -> str:
    return path.read_text().strip()


@pytest.mark.parametrize(("prefill_use", "decode_use", "serves"), PAIRS)
def test_workers_of_neighbouring_key_uses_serve_each_other(
    workers: dict[tuple[str, str], Runtime],
    key_files: dict[str, Path],
    prefill_use: str,
    decode_use: str,
    serves: bool,
) -> None:
    prefill, decode = workers[(c.ROLE_PREFILL, prefill_use)], workers[(c.ROLE_DECODE, decode_use)]
    # the key the router presents then: one both accept (every use here accepts a)
    outcome = _request(prefill, decode, _key(key_files["a"]))
    assert (outcome == COMPLETED) is serves, (prefill_use, decode_use, outcome)


def test_a_worker_in_a_rotation_takes_either_key_on_its_http_port_and_no_other(
    workers: dict[tuple[str, str], Runtime], key_files: dict[str, Path]
) -> None:
    rotating = workers[(c.ROLE_DECODE, "a-accepts-b")]
    settled = workers[(c.ROLE_DECODE, "a")]
    url = f"{rotating.url}{c.GENERATE_PATH}"
    for key in (_key(key_files["a"]), _key(key_files["b"])):
        # a body the engine refuses (400) once past the key check
        assert http_status("POST", url, {}, {"Authorization": f"Bearer {key}"}) == 400
    assert http_status("POST", url, {}, {"Authorization": "Bearer " + "x" * 43}) == 401
    b_key = {"Authorization": f"Bearer {_key(key_files['b'])}"}
    assert http_status("POST", f"{settled.url}{c.GENERATE_PATH}", {}, b_key) == 401
