"""An API client for unit tests that make no API call (or replace the calls they make): the
operator's context and its parts are built with one, as the operator builds them."""

from __future__ import annotations

from pathlib import Path

import certifi

from pdwarden_operator.kube.client import KubeClient
from pdwarden_operator.kube.credentials import Credentials

# `.invalid` never resolves: a request a test did not expect fails at once, reaching nothing.
UNREACHABLE_SERVER = "https://kube.invalid"


def unreachable_client() -> KubeClient:
    """A client whose server no test reaches; its session is made only by a request."""
    return KubeClient(Credentials(server=UNREACHABLE_SERVER, ca_file=Path(certifi.where())))
