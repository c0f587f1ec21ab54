"""The PD side channel at the hardened NIXL classes: checked on receipt, signed on the way out.

SGLang's ZMQ side channel and bootstrap routes take any message. The manager's
``server_socket`` is a ``CheckingSocket`` (SGLang's reading thread sees only messages with a
valid proof, and a prefill's only those its parsers take), what the manager and the receiver
send carries the proof, a rank registers with a signed PUT, and a decode reads ranks with the
proof and checks the server's signed answer before it registers or publishes anything. A
decode registration NIXL refuses is dropped, not raised. What is dropped is counted
(``pdwarden_runtime_errors_total{where="side_channel"}``), never fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sglang.srt.disaggregation.common.conn import _get_bootstrap_session
from sglang.srt.environ import envs

from pdwarden_contract import ROLE_PREFILL
from pdwarden_runtime.hardening.bootstrap_guard import (
    PROOF_HEADER,
    answer_check,
    register_signed,
    route_read_proof,
)
from pdwarden_runtime.hardening.config import ConfigError, HardeningConfig
from pdwarden_runtime.hardening.runtime import WHERE_SIDE_CHANNEL, RoomRuntime
from pdwarden_runtime.hardening.side_channel import SideKeys
from pdwarden_runtime.hardening.side_frames import prefill_message_problem
from pdwarden_runtime.hardening.side_socket import CheckingSocket, DropLog, SigningSocket

log = logging.getLogger(__name__)


def refuse_unsigned_staging(config: HardeningConfig) -> None:
    """SGLang's staging requests go out on sockets of their own, unsigned: with a worker key
    every one would be dropped and its transfer would wait for its deadline."""
    if config.side_keys.keyed and envs.SGLANG_DISAGG_STAGING_BUFFER.get():
        raise ConfigError(
            "SGLANG_DISAGG_STAGING_BUFFER is not supported with the model's worker key: "
            "SGLang's staging requests cannot carry the PD side channel's proof"
        )


class SideChannelGuard:
    """The side channel of one KV manager."""

    def __init__(self, rt: RoomRuntime, stock: Any) -> None:
        self._rt = rt
        self._stock = stock  # SGLang's methods of the manager (what super() reaches)
        self._drops = DropLog(f"pdwarden {rt.role} KV manager")

    @property
    def _keys(self) -> SideKeys:
        return self._rt.config.side_keys  # read per message: the keys may be swapped

    def checking_socket(self, sock: Any) -> CheckingSocket:
        shape = prefill_message_problem if self._rt.role == ROLE_PREFILL else None
        return CheckingSocket(sock, self._keys, self.dropped, shape)

    def dropped(self, reason: str) -> None:
        self._rt.count_error(WHERE_SIDE_CHANNEL)
        self._drops.dropped(reason)

    def send(self, endpoint: str, parts: list[bytes], is_ipv6: bool) -> None:
        self._stock._send_multipart_locked(endpoint, self._keys.sign(parts), is_ipv6=is_ipv6)

    def register_topology_row(self, url: str, payload: dict[str, Any]) -> None:
        keys = self._keys
        if keys.signer is None:
            self._stock._register_topology_row(url, payload)
            return
        register_signed(url, payload, keys)

    def add_remote_peer(self, decode_kv_args: Any, registered: dict[str, Any]) -> None:
        # NIXL refuses metadata that is not an agent's: SGLang's bootstrap thread would die
        # of it. The registration is dropped instead (the decode's rooms then fail).
        name = decode_kv_args.agent_name
        known = name in registered
        try:
            self._stock._add_remote_peer(decode_kv_args)
        except Exception as err:
            if not known:
                registered.pop(name, None)
            log.debug("a decode registration was refused", exc_info=True)
            self.dropped(f"a decode registration NIXL refused ({type(err).__name__})")


def signing_connect(sock: Any, keys: SideKeys) -> Any:
    """A decode's socket to a prefill (registration, metadata, ABORT, staging replies): what
    goes out on it carries the side channel's proof."""
    return sock if keys.signer is None else SigningSocket(sock, keys)


def checked_route_fetch(
    bootstrap_addr: str, keys: SideKeys, fetch: Callable[[], Any], refused: Callable[[], None]
) -> Any:
    """SGLang's fetch of a rank's address (the one place its decode learns one; a cached
    answer was checked when fetched), with the proof on SGLang's session and the answer
    checked: an unproven answer reads as none, so SGLang fails the room ("Could not fetch
    bootstrap info") before it registers with or publishes pages to that rank."""
    check = None
    if keys.keyed:  # SGLang asks on this session (one per thread and prefill)
        session = _get_bootstrap_session(bootstrap_addr)
        if keys.signer is not None:
            session.headers[PROOF_HEADER] = route_read_proof(keys.signer)
        check = answer_check(session, keys)
        check.take_refusal()  # a refusal left by a fetch that did not reach this one
    info = fetch()
    if check is not None and check.take_refusal():
        refused()
    return info
