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

Without a key only the ``rank_ip`` rule applies (nothing else can be checked).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from pdwarden_runtime.hardening.side_channel import SideKey

log = logging.getLogger(__name__)

PROOF_HEADER: Final = "X-Pdwarden-Side-Proof"
ROUTE_PATH: Final = "/route"
# SGLang's summary query: every coordinate -1 (``try_ensure_parallel_info``).
SUMMARY_QUERY: Final = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})
REGISTER_ATTEMPTS: Final = 5
REGISTER_TIMEOUT_S: Final = 5.0


def route_read_proof(key: SideKey) -> str:
    return key.http_proof("GET", ROUTE_PATH)


def _normal(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address.strip("[]")))
    except ValueError:
        return address.strip().lower()


@dataclass(frozen=True)
class RouteGate:
    key: SideKey | None
    # This pod's addresses; None: any (a multi-node replica, whose other pods register here).
    own_addresses: frozenset[str] | None

    @classmethod
    def for_server(cls, key: SideKey | None, addresses: Iterable[str | None], any_rank_ip: bool) -> RouteGate:
        own = frozenset(_normal(a) for a in addresses if a is not None and a not in WILDCARDS)
        return cls(key, None if any_rank_ip else own)

    def refusal(self, method: str, query: Mapping[str, str], header: str | None, body: bytes) -> str | None:
        """None when the request may reach SGLang's handler; else why it is refused (403)."""
        if method == "PUT":
            if self.key is not None and not self.key.http_verify(header, "PUT", ROUTE_PATH, body):
                return "a rank registration needs the model's side-channel proof"
            return self._rank_ip_refusal(body)
        if (
            method == "GET"
            and self.key is not None
            and not _is_summary(query)
            and not self.key.http_verify(header, "GET", ROUTE_PATH)
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
    url: str, payload: Mapping[str, Any], key: SideKey, attempts: int = REGISTER_ATTEMPTS
) -> bool:
    """PUT a rank's registration with its proof, retrying with backoff as SGLang does; True
    once the server took it."""
    body = json.dumps(dict(payload)).encode()
    headers = {"Content-Type": "application/json", PROOF_HEADER: key.http_proof("PUT", ROUTE_PATH, body)}
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
