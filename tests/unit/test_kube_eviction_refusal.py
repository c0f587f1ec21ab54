"""A 429 from the Eviction API told apart: a PodDisruptionBudget's refusal, or throttling."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from pdwarden_operator.kube.client import KubeApiError, _api_error
from pdwarden_operator.kube.pods import eviction_refusal

pytestmark = pytest.mark.unit


def error(
    body: Mapping[str, object] | None, headers: dict[str, str] | None = None, status: int = 429
) -> KubeApiError:
    """The client's error for an eviction answered `status` with `body` and `headers`."""
    raw = json.dumps(body).encode() if body is not None else None
    return _api_error(status, "Too Many Requests", raw, headers, "POST", "/eviction")


PDB_BODY = {
    "kind": "Status",
    "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {
        "causes": [{"reason": "DisruptionBudget", "message": "The disruption budget needs 1 healthy pod"}]
    },
    "code": 429,
}


def test_a_disruption_budget_refusal_names_its_cause() -> None:
    exc = error(PDB_BODY)
    assert exc.causes == ("DisruptionBudget",) and exc.retry_after is None
    assert eviction_refusal(exc) == "refused-by-pdb"


def test_a_stale_budget_refusal_carries_its_retry_after() -> None:
    body = {**PDB_BODY, "details": {"causes": [{"type": "DisruptionBudget"}], "retryAfterSeconds": 10}}
    exc = error(body)
    assert eviction_refusal(exc) == "refused-by-pdb" and exc.retry_after == 10


def test_throttling_is_not_a_budget_refusal() -> None:
    body = {
        "kind": "Status",
        "reason": "TooManyRequests",
        "message": "too many requests, please try again later",
    }
    exc = error(body, {"Retry-After": "7"})
    assert eviction_refusal(exc) == "throttled" and exc.retry_after == 7


@pytest.mark.parametrize("retry_after", ["soon", "-3", "999999"])
def test_a_nonsense_retry_after_is_ignored(retry_after: str) -> None:
    exc = error(None, {"Retry-After": retry_after})
    assert exc.retry_after is None and eviction_refusal(exc) == "throttled"


def test_other_statuses_are_not_refusals() -> None:
    assert eviction_refusal(error(None, status=500)) is None
