"""The runtime's side of the model's worker key (pure parts): which paths stay open, how a
header is checked, how the key file is read, and SGLang's --api-key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdwarden_runtime.engines.sglang_engine import SglangArgumentError, worker_key_args
from pdwarden_runtime.router_gate import (
    CONTROL_PLANE_KEY_ID,
    control_plane_key,
    downstream_headers,
    router_command,
    upstream_headers,
)
from pdwarden_runtime.worker_key import WorkerKeyError, authorized, is_open, read_key_file

pytestmark = pytest.mark.unit

KEY = "k" * 43


@pytest.mark.parametrize(
    ("path", "open_"),
    [
        ("/health", True),
        ("/health_generate", True),
        ("/metrics", True),
        ("/generate", False),
        ("/debug/state", False),
        ("/debug/fault", False),
        ("/get_server_info", False),
        ("/v1/models", False),
        ("/", False),
        ("/x/health", False),
    ],
)
def test_only_probes_and_scrapes_go_without_the_key(path: str, open_: bool) -> None:
    assert is_open(path) is open_


def test_the_header_must_be_a_bearer_of_exactly_the_key() -> None:
    assert authorized(f"Bearer {KEY}", KEY)
    assert authorized(f"bearer {KEY}", KEY)  # the scheme is case-insensitive (RFC 9110)
    for header in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer "):
        assert not authorized(header, KEY), header


def test_the_key_file_is_one_word_of_enough_characters(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text(f"  {KEY}\n")
    assert read_key_file(good) == KEY
    cases = {
        "missing": (None, "cannot read"),
        "empty": ("", "at least 16"),
        "short": ("abc", "at least 16"),
        "two-words": (f"{KEY} {KEY}", "one word"),
        "binary": (b"\xff" * 40, "not ASCII"),
        "huge": ("a" * 5000, "over 4096"),
    }
    for name, (content, why) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        with pytest.raises(WorkerKeyError, match=why):
            read_key_file(path)


def test_sglang_gets_the_key_as_its_api_key_and_a_users_own_is_refused() -> None:
    assert worker_key_args(None, ["--api-key", "mine"]) == []  # without the model's key: the user's
    admin = "a" * 43
    assert worker_key_args(KEY, ["--tp", "2"], admin) == [f"--api-key={KEY}", f"--admin-api-key={admin}"]
    for given in (["--api-key", "mine"], ["--api-key=mine"], ["--api-k", "mine"]):
        with pytest.raises(SglangArgumentError, match="worker key"):
            worker_key_args(KEY, given)
    # a user's own admin key stands (kept from the router); none is added beside it
    for own in (["--admin-api-key", "admin"], ["--admin-api-key=admin"], ["--admin-api", "admin"]):
        assert worker_key_args(KEY, own) == [f"--api-key={KEY}"]


def test_the_worker_key_never_opens_sglangs_admin_routes() -> None:
    """Without an admin key of the user's, SGLang gets a fresh one per process: different from
    the worker key and from another process's, so the key the router presents opens no admin
    route (SGLang's ADMIN_OPTIONAL routes take only --admin-api-key once it is set)."""
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    first, second = worker_key_args(KEY, []), worker_key_args(KEY, [])
    admin = first[1].partition("=")[2]
    assert first[1].startswith("--admin-api-key=") and len(admin) >= 43
    assert admin != KEY and first[1] != second[1]

    def allowed(header: str, level: AuthLevel) -> bool:
        return decide_request_auth(
            method="POST",
            path="/update_weights_from_disk",
            authorization_header=header,
            api_key=KEY,
            admin_api_key=admin,
            auth_level=level,
        ).allowed

    assert not allowed(f"Bearer {KEY}", AuthLevel.ADMIN_OPTIONAL)
    assert not allowed(f"Bearer {KEY}", AuthLevel.ADMIN_FORCE)
    assert allowed(f"Bearer {KEY}", AuthLevel.NORMAL)  # the serving routes


def test_during_a_rotation_sglang_takes_the_accepted_key_on_serving_routes_alone() -> None:
    """`auth_keys.accept_also` over SGLang's own decision function, in a module of its own
    (the real one is wrapped only in SGLang's processes)."""
    import types

    from sglang.srt.utils import auth

    from pdwarden_runtime.sglang_boot.auth_keys import accept_also

    module = types.ModuleType("auth_copy")
    module.decide_request_auth = auth.decide_request_auth  # type: ignore[attr-defined]
    new, admin = "n" * 43, "a" * 43
    accept_also(module, [new])
    accept_also(module, [new])  # installed twice: still one wrapper over SGLang's function

    def allowed(header: str | None, level: auth.AuthLevel) -> bool:
        decision = module.decide_request_auth(
            method="POST",
            path="/generate",
            authorization_header=header,
            api_key=KEY,
            admin_api_key=admin,
            auth_level=level,
        )
        return bool(decision.allowed)

    assert allowed(f"Bearer {KEY}", auth.AuthLevel.NORMAL) and allowed(f"Bearer {new}", auth.AuthLevel.NORMAL)
    assert not allowed(f"Bearer {'x' * 43}", auth.AuthLevel.NORMAL) and not allowed(
        None, auth.AuthLevel.NORMAL
    )
    assert not allowed(f"Bearer {new}", auth.AuthLevel.ADMIN_OPTIONAL)
    assert not allowed(f"Bearer {new}", auth.AuthLevel.ADMIN_FORCE)
    assert allowed(f"Bearer {admin}", auth.AuthLevel.ADMIN_FORCE)
    assert auth.decide_request_auth is not module.decide_request_auth  # SGLang's own left alone


def test_the_gate_presents_the_key_in_place_of_the_clients_and_keeps_end_to_end_headers() -> None:
    client = {
        "Authorization": "Bearer a-client-token",
        "Host": "router:8000",
        "Connection": "keep-alive",
        "Content-Length": "12",
        "Content-Type": "application/json",
        "X-Request-Id": "r-1",
    }
    assert upstream_headers(client, KEY) == {
        "Content-Type": "application/json",
        "X-Request-Id": "r-1",
        "Authorization": f"Bearer {KEY}",
    }
    answer = [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked"), ("X-A", "1")]
    assert downstream_headers(dict(answer)) == [("Content-Type", "text/event-stream"), ("X-A", "1")]


@pytest.mark.parametrize("key", ["plain-key_0", "-starts-with-a-dash", "--looks-like-a-flag"])
def test_smg_reads_any_worker_key_as_its_api_key(key: str) -> None:
    """The router gate's smg command through smg's own parser: a urlsafe key starts with "-"
    one time in 64, and smg must still take it as the value (it once refused to start)."""
    from smg.launch_router import parse_router_args

    cmd = router_command(["--pd-disaggregation", "--host", "127.0.0.1", "--port", "29001"], key, key)
    parsed = parse_router_args(cmd)
    assert parsed.api_key == key
    assert parsed.control_plane_api_keys == [(CONTROL_PLANE_KEY_ID, "gate", key, "admin")]


def test_smg_gets_a_control_plane_key_of_its_own_with_or_without_the_worker_key() -> None:
    from smg.launch_router import parse_router_args

    base = ["--pd-disaggregation", "--host", "127.0.0.1", "--port", "29001"]
    control = control_plane_key()
    assert control != control_plane_key() and len(control) >= 43  # fresh per run, 32 random bytes
    without = parse_router_args(router_command(base, None, control))
    assert without.api_key is None
    assert without.control_plane_api_keys == [(CONTROL_PLANE_KEY_ID, "gate", control, "admin")]
    assert KEY not in router_command(base, None, control)


def test_without_a_worker_key_the_gate_drops_the_clients_authorization() -> None:
    assert upstream_headers({"Authorization": "Bearer mine", "X-A": "1"}, None) == {"X-A": "1"}
