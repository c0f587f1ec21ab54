"""The PD side channel's proof (pure parts): signing and verifying ZMQ messages and HTTP
requests, the checking socket SGLang's threads read through, the rate-limited drop log, and
the bootstrap server's gate on /route."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pdwarden_runtime.hardening.bootstrap_guard import ROUTE_PATH, RouteGate, route_read_proof
from pdwarden_runtime.hardening.config import ConfigError, HardeningConfig
from pdwarden_runtime.hardening.side_channel import PROOF_FRAME_BYTES, SideKey, SideKeys
from pdwarden_runtime.hardening.side_socket import REASON_NO_PROOF, CheckingSocket, DropLog, SigningSocket

pytestmark = pytest.mark.unit

KEY = SideKey.derive("k" * 43)
OTHER = SideKey.derive("o" * 43)
KEYS = SideKeys(KEY)  # a pod that signs with KEY and requires it
# A decode's metadata for a room (SGLang's layout: GUARD, room, ip, port, agent, indices, ...).
MESSAGE = [b"NixlMsgGuard", b"12345", b"198.18.0.7", b"40123", b"agent-d", bytes(range(64)), b"3", b"1"]


def test_a_signed_message_verifies_to_its_own_frames() -> None:
    signed = KEY.sign(MESSAGE)
    assert len(signed) == len(MESSAGE) + 1 and len(signed[-1]) == PROOF_FRAME_BYTES
    assert KEY.verify(signed) == MESSAGE
    assert signed[:-1] == MESSAGE  # the frames themselves travel unchanged


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(MESSAGE, id="no-proof"),
        pytest.param([b"x"], id="one-bare-frame"),
        pytest.param([], id="empty"),
        pytest.param(OTHER.sign(MESSAGE), id="another-keys-proof"),
        pytest.param([*MESSAGE[:1], b"12346", *MESSAGE[2:], KEY.proof(MESSAGE)], id="tampered-frame"),
        pytest.param([MESSAGE[1], MESSAGE[0], *MESSAGE[2:], KEY.proof(MESSAGE)], id="reordered-frames"),
        pytest.param([MESSAGE[0] + MESSAGE[1], *MESSAGE[2:], KEY.proof(MESSAGE)], id="joined-frames"),
        pytest.param([*MESSAGE, b"extra", KEY.proof(MESSAGE)], id="added-frame"),
        pytest.param([*MESSAGE[:-1], KEY.proof(MESSAGE)], id="dropped-frame"),
        pytest.param([*MESSAGE, KEY.proof(MESSAGE)[:-1]], id="short-proof"),
        pytest.param([*MESSAGE, b"\0" * PROOF_FRAME_BYTES], id="zero-proof"),
    ],
)
def test_what_is_not_the_keys_proof_of_these_frames_is_refused(forged: list[bytes]) -> None:
    assert KEY.verify(forged) is None


def test_moving_bytes_across_a_frame_boundary_changes_the_proof() -> None:
    # Without length prefixes [b"ab", b"c"] and [b"a", b"bc"] would hash alike.
    assert KEY.proof([b"ab", b"c"]) != KEY.proof([b"a", b"bc"])


def test_http_proofs_bind_method_path_and_body_and_differ_from_zmq_ones() -> None:
    body = b'{"rank_ip": "198.18.0.7"}'
    proof = KEY.http_proof("PUT", ROUTE_PATH, body)
    assert KEY.http_verify(proof, "PUT", ROUTE_PATH, body)
    assert not KEY.http_verify(proof, "PUT", ROUTE_PATH, body.replace(b"7", b"8"))
    assert not KEY.http_verify(proof, "GET", ROUTE_PATH, body)
    assert not KEY.http_verify(OTHER.http_proof("PUT", ROUTE_PATH, body), "PUT", ROUTE_PATH, body)
    assert not KEY.http_verify(None, "PUT", ROUTE_PATH, body)
    assert bytes.fromhex(proof) != KEY.proof([b"PUT", ROUTE_PATH.encode(), body])


def test_the_key_is_derived_never_the_worker_key_and_never_shown() -> None:
    assert "k" * 43 not in repr(KEY) and "hidden" in repr(KEY)
    assert KEY.proof(MESSAGE) != SideKey(("k" * 43).encode()).proof(MESSAGE)
    with pytest.raises(ValueError):
        SideKey(b"short")


def test_the_hardening_config_derives_the_key_from_the_worker_key_file(tmp_path: Path) -> None:
    path = tmp_path / "key"
    path.write_text("k" * 43 + "\n")
    config = HardeningConfig.from_mapping({"worker_key_file": str(path)})
    signer = config.side_keys.signer
    assert signer is not None and signer.proof(MESSAGE) == KEY.proof(MESSAGE)
    assert config.side_keys.required
    assert "k" * 43 not in repr(config)
    assert not HardeningConfig().side_keys.keyed
    path.write_text("short\n")
    with pytest.raises(ConfigError, match="at least"):
        HardeningConfig.from_mapping({"worker_key_file": str(path)})


def test_the_sglang_launch_hands_its_processes_the_key_file_never_the_key(tmp_path: Path) -> None:
    from pdwarden_runtime.engines.sglang_engine import hardening_config
    from pdwarden_runtime.sglang_boot import ENV_HARDENING_CONFIG, seam_env

    path = tmp_path / "key"
    path.write_text("k" * 43 + "\n")
    config = hardening_config(SimpleNamespace(worker_key_file=str(path), inflight_deadline=None))
    env = seam_env({}, config)
    assert json.loads(env[ENV_HARDENING_CONFIG])["worker_key_file"] == str(path)
    assert all("k" * 43 not in value for value in env.values())
    side_key = HardeningConfig.from_mapping(config).side_keys.signer
    assert side_key is not None and side_key.proof(MESSAGE) == KEY.proof(MESSAGE)
    assert "worker_key_file" not in hardening_config(
        SimpleNamespace(worker_key_file=None, inflight_deadline=None)
    )


class FakeSocket:
    def __init__(self, incoming: list[list[bytes]]) -> None:
        self.incoming = list(incoming)
        self.sent: list[list[bytes]] = []
        self.closed = False

    def recv_multipart(self) -> list[bytes]:
        return self.incoming.pop(0)

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(list(frames))

    def close(self) -> None:
        self.closed = True


def test_the_checking_socket_returns_only_verified_messages_without_their_proof() -> None:
    drops: list[str] = []
    garbage = [[b"x"], MESSAGE, OTHER.sign(MESSAGE)]
    sock = CheckingSocket(FakeSocket([*garbage, KEY.sign(MESSAGE)]), KEYS, drops.append)
    assert sock.recv_multipart() == MESSAGE
    assert drops == [REASON_NO_PROOF] * 3


def test_without_a_key_the_shape_check_still_drops_what_sglang_cannot_take() -> None:
    drops: list[str] = []

    def shape(frames: list[bytes]) -> str | None:
        if frames == [b"boom"]:
            raise ValueError("a check's own failure")
        return None if frames[0] == MESSAGE[0] else "unknown message tag"

    sock = CheckingSocket(FakeSocket([[b"x"], [b"boom"], MESSAGE]), None, drops.append, shape)
    assert sock.recv_multipart() == MESSAGE
    assert drops == ["unknown message tag", "shape check failed (ValueError)"]


def test_a_failing_drop_report_does_not_end_the_reader() -> None:
    def report(reason: str) -> None:
        raise RuntimeError("metrics are down")

    sock = CheckingSocket(FakeSocket([[b"x"], KEY.sign(MESSAGE)]), KEYS, report)
    assert sock.recv_multipart() == MESSAGE


def test_the_signing_socket_appends_the_proof_and_passes_the_rest_through() -> None:
    inner = FakeSocket([])
    sock = SigningSocket(inner, KEYS)
    sock.send_multipart(MESSAGE)
    sock.close()
    assert KEY.verify(inner.sent[0]) == MESSAGE and inner.closed


def test_drops_are_logged_at_most_once_per_interval_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    drops = DropLog("prefill", interval=10.0, clock=lambda: now[0])
    with caplog.at_level("WARNING"):
        logged = [drops.dropped("r1"), drops.dropped("r2"), drops.dropped("r3")]
        now[0] += 10.0
        logged.append(drops.dropped("r4"))
    assert logged == [True, False, False, True]
    assert ": 1 message(s) dropped" in caplog.records[0].getMessage()
    assert (
        ": 3 message(s) dropped" in caplog.records[1].getMessage() and "r4" in caplog.records[1].getMessage()
    )


def _registration(rank_ip: str) -> bytes:
    return json.dumps({"rank_ip": rank_ip, "rank_port": 40000}).encode()


RANK_QUERY = {"prefill_dp_rank": "0", "prefill_cp_rank": "0", "target_tp_rank": "0", "target_pp_rank": "0"}
SUMMARY_QUERY = dict.fromkeys(RANK_QUERY, "-1")


def test_the_route_gate_takes_only_signed_registrations_of_this_pods_ranks() -> None:
    gate = RouteGate.for_server(KEYS, ["198.18.0.7", None], any_rank_ip=False)
    own, stranger = _registration("198.18.0.7"), _registration("127.0.0.2")
    assert gate.refusal("PUT", {}, KEY.http_proof("PUT", ROUTE_PATH, own), own) is None
    assert gate.refusal("PUT", {}, None, own) is not None
    assert gate.refusal("PUT", {}, OTHER.http_proof("PUT", ROUTE_PATH, own), own) is not None
    assert (
        gate.refusal("PUT", {}, KEY.http_proof("PUT", ROUTE_PATH, own), stranger) is not None
    )  # not its body
    refused = gate.refusal("PUT", {}, KEY.http_proof("PUT", ROUTE_PATH, stranger), stranger)
    assert refused is not None and "own pod" in refused
    assert gate.refusal("PUT", {}, KEY.http_proof("PUT", ROUTE_PATH, b"[1"), b"[1") is not None


def test_the_route_gate_names_a_rank_only_to_key_holders_and_leaves_the_summary_open() -> None:
    gate = RouteGate.for_server(KEYS, ["198.18.0.7"], any_rank_ip=False)
    assert gate.refusal("GET", RANK_QUERY, None, b"") is not None
    assert gate.refusal("GET", RANK_QUERY, OTHER.http_proof("GET", ROUTE_PATH), b"") is not None
    assert gate.refusal("GET", RANK_QUERY, route_read_proof(KEY), b"") is None
    assert gate.refusal("GET", SUMMARY_QUERY, None, b"") is None


def test_without_a_key_only_the_own_address_rule_holds_and_multi_node_lifts_it() -> None:
    bare = RouteGate.for_server(None, ["198.18.0.7", "0.0.0.0"], any_rank_ip=False)
    assert bare.own_addresses == frozenset({"198.18.0.7"})
    assert bare.refusal("PUT", {}, None, _registration("198.18.0.7")) is None
    assert bare.refusal("PUT", {}, None, _registration("127.0.0.2")) is not None
    assert bare.refusal("GET", RANK_QUERY, None, b"") is None
    group = RouteGate.for_server(KEYS, ["198.18.0.7"], any_rank_ip=True)
    other_pod = _registration("198.18.0.8")
    assert group.refusal("PUT", {}, KEY.http_proof("PUT", ROUTE_PATH, other_pod), other_pod) is None
    assert group.refusal("PUT", {}, None, other_pod) is not None


# --- a pod's keys while the model's key rolls out or rotates --------------------------


def test_a_rotating_pod_accepts_either_key_and_signs_with_its_own() -> None:
    rotating = SideKeys.derive("k" * 43, ["o" * 43])
    assert rotating.open(KEY.sign(MESSAGE)) == MESSAGE
    assert rotating.open(OTHER.sign(MESSAGE)) == MESSAGE
    assert rotating.open(MESSAGE) is None  # still no message without a proof
    assert rotating.open(SideKey.derive("s" * 43).sign(MESSAGE)) is None
    assert KEY.verify(rotating.sign(MESSAGE)) == MESSAGE
    body = _registration("198.18.0.7")
    assert rotating.http_accepts(OTHER.http_proof("PUT", ROUTE_PATH, body), "PUT", ROUTE_PATH, body)
    assert not rotating.http_accepts(None, "PUT", ROUTE_PATH, body)


def test_a_lenient_pod_signs_and_takes_messages_with_or_without_a_proof() -> None:
    lenient = SideKeys.derive("k" * 43, lenient=True)
    assert lenient.open(KEY.sign(MESSAGE)) == MESSAGE
    assert lenient.open(MESSAGE) == MESSAGE
    assert lenient.open(OTHER.sign(MESSAGE)) == MESSAGE  # a proof it cannot check is dropped
    assert KEY.verify(lenient.sign(MESSAGE)) == MESSAGE
    assert lenient.http_accepts(None, "GET", ROUTE_PATH) and not lenient.required


def test_a_pod_without_a_key_drops_a_signing_peers_proof_and_signs_nothing() -> None:
    bare = SideKeys()
    assert not bare.keyed and bare.open(KEY.sign(MESSAGE)) == MESSAGE
    assert bare.open(MESSAGE) == MESSAGE and bare.sign(MESSAGE) == MESSAGE
    # a last frame of a proof's length that is not marked as one is SGLang's own
    looks_alike = [*MESSAGE, b"\1" * PROOF_FRAME_BYTES]
    assert bare.open(looks_alike) == looks_alike


@pytest.mark.parametrize(
    ("sender", "receiver"),
    [
        pytest.param(SideKeys(), SideKeys.derive("k" * 43, lenient=True), id="switch-on-old-to-new"),
        pytest.param(SideKeys.derive("k" * 43, lenient=True), SideKeys(), id="switch-on-new-to-old"),
        pytest.param(SideKeys.derive("k" * 43, lenient=True), KEYS, id="strict-step-old-to-new"),
        pytest.param(KEYS, SideKeys.derive("k" * 43, ["o" * 43]), id="rotation-accept"),
        pytest.param(
            SideKeys.derive("o" * 43, ["k" * 43]), SideKeys.derive("k" * 43, ["o" * 43]), id="rotation-sign"
        ),
        pytest.param(SideKeys.derive("o" * 43, ["k" * 43]), SideKeys.derive("o" * 43), id="rotation-end"),
    ],
)
def test_pods_of_neighbouring_steps_take_each_others_messages(sender: SideKeys, receiver: SideKeys) -> None:
    assert receiver.open(sender.sign(MESSAGE)) == MESSAGE


def test_the_hardening_config_reads_the_accepted_keys_and_leniency(tmp_path: Path) -> None:
    own, other = tmp_path / "own", tmp_path / "other"
    own.write_text("k" * 43)
    other.write_text("o" * 43)
    config = HardeningConfig.from_mapping(
        {"worker_key_file": str(own), "worker_key_accept_files": [str(other)], "side_channel_lenient": True}
    )
    assert config.side_keys.open(OTHER.sign(MESSAGE)) == MESSAGE and config.side_keys.lenient
    with pytest.raises(ConfigError, match="list of paths"):
        HardeningConfig.from_mapping({"worker_key_accept_files": str(other)})
