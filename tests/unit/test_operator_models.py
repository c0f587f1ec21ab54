"""The pydantic models: examples parse, defaults hold, and the invalid corpus is rejected here too."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from pdwarden_operator.models import DisaggregatedModelSpec, parse_spec
from pdwarden_operator.reconcile.errors import describe_validation_error
from pdwarden_operator.resource.router import ROUTER_OWNED_ARGS
from pdwarden_operator.resource.rules import Rule

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INVALID = sorted((ROOT / "tests/data/invalid").glob("*.yaml"))


def expected_path(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: <field path>'"
    return first.removeprefix("# expect: ").strip()


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(example: Path) -> None:
    doc = yaml.safe_load(example.read_text())
    spec = parse_spec(doc["spec"])
    assert spec.model.path


def test_defaults() -> None:
    spec = parse_spec({"model": {"path": "m"}})
    assert spec.engine == "sglang"
    assert (spec.prefill.replicas, spec.decode.replicas, spec.router.replicas) == (1, 1, 1)
    assert spec.prefill.tensor_parallel == 1 and spec.prefill.gpus == 0
    assert spec.prefill.gpu_toleration is True and spec.decode.gpu_toleration is True
    off = parse_spec({"model": {"path": "m"}, "decode": {"gpuToleration": False}})
    assert off.decode.gpu_toleration is False and off.prefill.gpu_toleration is True
    assert spec.watchdog.stuck_after_seconds == 360 and spec.watchdog.action == "drain"
    assert spec.watchdog.stuck_after_seconds > spec.transfer.inflight_deadline_seconds
    assert spec.transfer.backend == "nixl"


def test_invalid_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 25


# Rules on metadata and on the presence of spec live only in the CRD.
SPEC_LEVEL = [p for p in INVALID if expected_path(p).startswith("spec.")]


@pytest.mark.parametrize("manifest", SPEC_LEVEL, ids=lambda p: p.name)
def test_invalid_spec_is_rejected_by_the_models_too(manifest: Path) -> None:
    doc = yaml.safe_load(manifest.read_text())
    with pytest.raises(ValidationError) as info:
        parse_spec(doc["spec"])
    message = describe_validation_error(info.value)
    assert message.startswith("spec"), message


def _rules_of(model: type[BaseModel], seen: set[type[BaseModel]]) -> list[Rule]:
    """Every Rule of `model` and of the models its fields hold."""
    if model in seen:
        return []
    seen.add(model)
    out = list(getattr(model, "RULES", ()))
    for field in model.model_fields.values():
        stack: list[Any] = [field.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                out += _rules_of(annotation, seen)
            stack += get_args(annotation)
    return out


def test_every_rule_breaks_in_the_corpus_with_its_own_message() -> None:
    """Each cross-field Rule has an invalid manifest that breaks it, and the models refuse that
    manifest with the Rule's message (the API server's, tests/e2e/test_operator_invalid.py)."""
    rules = _rules_of(DisaggregatedModelSpec, set())
    assert len(rules) >= 20
    messages = []
    for manifest in SPEC_LEVEL:
        try:
            parse_spec(yaml.safe_load(manifest.read_text())["spec"])
        except ValidationError as exc:
            messages.append(describe_validation_error(exc))
    unbroken = [r.message for r in rules if not any(r.message in m for m in messages)]
    assert unbroken == [], "no manifest in tests/data/invalid breaks these rules"


@pytest.mark.parametrize(
    "arg",
    [
        "--host",
        "--host=0.0.0.0",
        "--ho",
        "--port=1",
        "--api-key=mine",
        "--control-plane-api-keys",
        "--control",
        "--disable-health-check",
        "--health-check-interval-secs=5",
        "--health-check-timeout-secs",
        "--health-check-endpoint",
        "--health-failure-threshold",
        "--health-success-threshold",
        "--remove-unhealthy-workers",
        "--no-remove-unhealthy-workers",
        "--worker-auto-recovery",
        "--no-worker-auto",
    ],
)
def test_the_router_pods_own_smg_options_are_refused_with_the_field_named(arg: str) -> None:
    """Where smg listens and its keys are the router pod's: smg on another address would face
    clients with its control plane, past the gate."""
    with pytest.raises(ValidationError) as info:
        parse_spec({"model": {"path": "m"}, "router": {"args": [arg, "0.0.0.0"]}})
    message = describe_validation_error(info.value)
    assert message.startswith("spec.router.args") and "set by the router pod" in message, message


def test_smgs_health_checks_and_worker_removal_are_the_router_pods_and_say_why() -> None:
    """Whether a worker serves is its pod's readiness and the watchdog's to say: smg's own checks
    and removal are off (render.router.ROUTER_HEALTH_ARGS), and a user may not switch them back on."""
    from pdwarden_operator.render.router import ROUTER_HEALTH_ARGS

    assert set(ROUTER_HEALTH_ARGS) <= set(ROUTER_OWNED_ARGS)
    with pytest.raises(ValidationError) as info:
        parse_spec({"model": {"path": "m"}, "router": {"args": ["--remove-unhealthy-workers"]}})
    message = describe_validation_error(info.value)
    assert message.startswith("spec.router.args") and "readiness" in message and "watchdog" in message


RESILIENCE_SPELLINGS = ["--retry-max-retries", "--disable-retries", "--cb-fail", "--disable-circuit"]


@pytest.mark.parametrize("arg", RESILIENCE_SPELLINGS)
def test_smgs_retries_and_breaker_are_the_router_pods_and_say_why(arg: str) -> None:
    """A request caught in a wedged room is answered by another pair only with the rendered
    retries and breaker (render.router.ROUTER_RESILIENCE_ARGS): a user may not change them."""
    from pdwarden_operator.render.router import ROUTER_RESILIENCE_ARGS

    assert {a for a in ROUTER_RESILIENCE_ARGS if a.startswith("--")} <= set(ROUTER_OWNED_ARGS)
    with pytest.raises(ValidationError) as info:
        parse_spec({"model": {"path": "m"}, "router": {"args": [arg, "1"]}})
    message = describe_validation_error(info.value)
    assert message.startswith("spec.router.args") and "another pair" in message, message


def test_other_smg_options_pass() -> None:
    args = ["--policy-extra", "x", "--health-check-port", "5", "--log-level", "info", "0.0.0.0"]
    assert parse_spec({"model": {"path": "m"}, "router": {"args": args}}).router.args == args
