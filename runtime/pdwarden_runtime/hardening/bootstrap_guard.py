"""The prefill's KV bootstrap HTTP server: who may register a rank, and who may read one.

SGLang's bootstrap server keeps the rank table decodes read to find a prefill rank's
side-channel address: ``PUT /route`` writes (overwrites) a rank, ``GET /route`` with a rank's
coordinates names its ``rank_ip``/``rank_port``. Unguarded, a stranger redirects every decode
(its NIXL metadata and its pages go to the stranger; the healthy prefill is blamed). The
hardened server asks ``RouteGate.refusal`` first:

- ``PUT /route`` needs ``PROOF_HEADER`` with the side-channel proof of its exact body (made
  by the registering rank, ``register_signed``), and its ``rank_ip`` must be this pod's own
  address (a prefill's ranks register with their own pod's server; in a multi-node replica,
  ``any_rank_ip``, the ranks of other pods register with the leader's: the proof alone).
- ``GET /route`` for a rank needs the proof of ``GET /route`` (decodes put it on the session
  SGLang asks with). The parallel-info summary (every coordinate -1) stays open: it names no
  address, and SGLang's decode asks it through a call pdwarden cannot add a header to.
- the answer naming a rank carries ``ANSWER_PROOF_HEADER``, the proof of its exact body
  (``route_answer_proof``): a decode publishes its pages only to a rank whose answer a key
  holder made (``RouteAnswerCheck``). A server that takes any request proof (one that is not
  a pod of the model) cannot make it, so a decode a router sent there publishes nothing. A
  replayed answer names a rank a pod of the model registered, nothing else.

Without a key only the ``rank_ip`` rule applies (nothing else can be checked); a pod whose
``SideKeys`` are lenient (a key being switched on or off) signs what it can and takes a
request or answer without a proof too.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pdwarden_runtime.hardening.side_channel import UNKEYED, SideKey, SideKeys

log = logging.getLogger(__name__)

PROOF_HEADER: Final = "X-Pdwarden-Side-Proof"
ANSWER_PROOF_HEADER: Final = "X-Pdwarden-Route-Proof"
# Not an HTTP method: an answer's proof is never a request's.
ANSWER_METHOD: Final = "ANSWER"
ROUTE_PATH: Final = "/route"
# SGLang's summary query: every coordinate -1 (``try_ensure_parallel_info``).
SUMMARY_QUERY: Final = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})
REGISTER_ATTEMPTS: Final = 5
REGISTER_TIMEOUT_S: Final = 5.0


def route_read_proof(key: SideKey) -> str:
    return key.http_proof("GET", ROUTE_PATH)


def route_answer_proof(key: SideKey, body: bytes) -> str:
    """The bootstrap server's proof of its answer naming a rank (the exact bytes it sends)."""
    return key.http_proof(ANSWER_METHOD, ROUTE_PATH, body)


def is_rank_query(query: Mapping[str, str]) -> bool:
    """A ``GET /route`` that asks for a rank's address (not the summary)."""
    return not _is_summary(query)


class UnprovenRouteAnswer(Exception):
    """A bootstrap server's answer naming a rank without the proof of the model's key."""


class RouteAnswerCheck:
    """A ``requests`` response hook for a decode's bootstrap session: an answer naming a
    rank without a valid ``ANSWER_PROOF_HEADER`` raises ``UnprovenRouteAnswer`` before
    SGLang reads it (SGLang fails that room as one whose bootstrap info could not be
    fetched). One per session, so per thread (SGLang's sessions are thread-local):
    ``take_refusal`` tells the caller that the last answer was refused."""

    def __init__(self, keys: SideKeys) -> None:
        self.keys = keys
        self._refused = False

    def __call__(self, response: Any, *args: Any, **kwargs: Any) -> None:
        request = response.request
        if request is None or request.method != "GET" or response.status_code != 200:
            return  # SGLang fails an answer that is not 200 on its own
        parts = urllib.parse.urlsplit(request.url)
        query = dict(urllib.parse.parse_qsl(parts.query))
        if parts.path != ROUTE_PATH or not is_rank_query(query):
            return
        header = response.headers.get(ANSWER_PROOF_HEADER)
        if self.keys.http_accepts(header, ANSWER_METHOD, ROUTE_PATH, response.content):
            return
        self._refused = True
        raise UnprovenRouteAnswer("the bootstrap server's answer carries no proof of the model's key")

    def take_refusal(self) -> bool:
        refused, self._refused = self._refused, False
        return refused


def answer_check(session: Any, keys: SideKeys) -> RouteAnswerCheck:
    """The session's ``RouteAnswerCheck`` for ``keys``, installed once (a check for other
    keys is replaced)."""
    hooks: list[Any] = session.hooks.setdefault("response", [])
    for hook in hooks:
        if isinstance(hook, RouteAnswerCheck) and hook.keys is keys:
            return hook
    hooks[:] = [hook for hook in hooks if not isinstance(hook, RouteAnswerCheck)]
    check = RouteAnswerCheck(keys)
    hooks.append(check)
    return check


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address.strip("[]")))
    except ValueError:
        return address.strip().lower()


@dataclass(frozen=True)
class RouteGate:
    keys: SideKeys
    # This pod's addresses; None: any (a multi-node replica, whose other pods register here).
    own_addresses: frozenset[str] | None

    @classmethod
    def for_server(
        cls, keys: SideKeys | None, addresses: Iterable[str | None], any_rank_ip: bool
    ) -> RouteGate:
        own = frozenset(_normal(a) for a in addresses if a is not None and a not in WILDCARDS)
        return cls(keys or UNKEYED, None if any_rank_ip else own)

    def refusal(self, method: str, query: Mapping[str, str], header: str | None, body: bytes) -> str | None:
        """None when the request may reach SGLang's handler; else why it is refused (403)."""
        if method == "PUT":
            if not self.keys.http_accepts(header, "PUT", ROUTE_PATH, body):
                return "a rank registration needs the model's side-channel proof"
            return self._rank_ip_refusal(body)
        if (
            method == "GET"
            and not _is_summary(query)
            and not self.keys.http_accepts(header, "GET", ROUTE_PATH)
        ):
            return "a rank's address is given only to the model's own pods"
        return None

    def _rank_ip_refusal(self, body: bytes) -> str | None:
        if self.own_addresses is None:
            return None
        try:
            data = json.loads(body)
        except ValueError:
            return "the registration is not JSON"
        rank_ip = data.get("rank_ip") if isinstance(data, dict) else None
        if not isinstance(rank_ip, str) or _normal(rank_ip) not in self.own_addresses:
            return "a rank registers only with its own pod's bootstrap server (rank_ip is not this pod's)"
        return None


def _is_summary(query: Mapping[str, str]) -> bool:
    return all(query.get(name) == "-1" for name in SUMMARY_QUERY)


def register_signed(
    url: str, payload: Mapping[str, Any], keys: SideKeys, attempts: int = REGISTER_ATTEMPTS
) -> bool:
    """PUT a rank's registration with its proof (when this pod signs), retrying with backoff
    as SGLang does; True once the server took it."""
    body = json.dumps(dict(payload)).encode()
    headers = {"Content-Type": "application/json"}
    if keys.signer is not None:
        headers[PROOF_HEADER] = keys.signer.http_proof("PUT", ROUTE_PATH, body)
    for attempt in range(attempts):
        request = urllib.request.Request(url, data=body, headers=headers, method="PUT")
        try:
            with urllib.request.urlopen(request, timeout=REGISTER_TIMEOUT_S) as resp:
                if resp.status == 200:
                    return True
                why = f"status {resp.status}"
        except urllib.error.HTTPError as err:
            why = f"status {err.code}"
        except (urllib.error.URLError, OSError) as err:
            why = type(err).__name__
        log.warning("prefill rank registration attempt %d/%d failed: %s", attempt + 1, attempts, why)
        if attempt + 1 < attempts:
            time.sleep(min(2.0**attempt, 30.0))
    log.error("prefill rank failed to register with its bootstrap server after %d attempts", attempts)
    return False
