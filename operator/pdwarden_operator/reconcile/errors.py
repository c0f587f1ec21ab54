"""What a reconcile pass raises: `Refused` (the spec, or children the API server refused, until a
person changes the spec), `RetryLater` (transient), and `InvalidSpec` (what `run.reconcile`
raises once a refusal is in the status). handlers.py translates them into kopf's."""

from __future__ import annotations

from pydantic import ValidationError

from pdwarden_operator.kube.client import KubeApiError
from pdwarden_operator.models import DisaggregatedModelSpec


class InvalidSpec(Exception):
    """The spec cannot be reconciled until a person changes it."""


class RetryLater(Exception):
    """A transient failure (API unavailable, conflict, throttling): try again after `delay`."""

    def __init__(self, message: str, delay: float = 5.0) -> None:
        super().__init__(message)
        self.delay = delay


class Refused(Exception):
    """What a pass found it cannot do until a person changes the spec: the spec itself
    (`reason` None: it does not validate, or the pod policy refuses it; `shown` is what the
    status says) or the children the API server refused (`reason`: ApplyFailed, NameTaken,
    WorkerKeyFailed). `reconcile` writes the status that says so, then raises InvalidSpec."""

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        spec: DisaggregatedModelSpec | None = None,
        shown: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.reason, self.spec = message, reason, spec
        self.shown = shown if shown is not None else message


def describe_validation_error(exc: ValidationError, prefix: str = "spec") -> str:
    """`spec.prefill.tensorParallel: must be ...; spec.model: Field required`."""
    parts = []
    for err in exc.errors():
        loc = ".".join([prefix, *(str(p) for p in err["loc"])])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def worker_key_failed(spec: DisaggregatedModelSpec, exc: KubeApiError) -> RetryLater | Refused:
    """What a failed write of the worker key's Secret (its dry-run probe or its creation) means."""
    if exc.retriable:
        return RetryLater(f"creating the worker key's Secret failed: {exc}")
    message = (
        f"cannot create the worker key's Secret ({exc.status} {exc.reason}: {exc.message}); the operator "
        "needs create on secrets in this namespace, or set spec.workerKey.enabled: false"
    )
    return Refused(message, reason="WorkerKeyFailed", spec=spec)
