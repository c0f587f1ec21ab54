"""The installation's pod policy: every power a template can take is refused with its field
named, unless the installation allows it (everywhere or in the model's namespace)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_operator import podpolicy
from pdwarden_operator.models import parse_spec
from pdwarden_operator.podpolicy import Allowance, PodPolicy

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
NONE: frozenset[Allowance] = frozenset()


def _spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"path": "synthetic/tiny"}, "engine": "synthetic"}
    spec.update(overrides)
    return spec


def _template(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"podTemplate": {"spec": pod_spec}}


def _refused(
    spec: dict[str, Any], allowed: frozenset[Allowance] = NONE, annotations: dict[str, str] | None = None
) -> list[str]:
    return podpolicy.violations(parse_spec(spec), "web", annotations or {}, allowed)


SIDECAR = {"name": "side", "image": "busybox"}

# (spec, the field named, the allowance that lets it through)
CASES: list[tuple[dict[str, Any], str, Allowance]] = [
    (
        _spec(prefill=_template({"serviceAccountName": "powerful"})),
        "spec.prefill.podTemplate.spec.serviceAccountName",
        Allowance.SERVICE_ACCOUNT,
    ),
    (
        _spec(decode=_template({"serviceAccount": "powerful"})),
        "spec.decode.podTemplate.spec.serviceAccount",
        Allowance.SERVICE_ACCOUNT,
    ),
    (
        _spec(prefill=_template({"automountServiceAccountToken": True})),
        "spec.prefill.podTemplate.spec.automountServiceAccountToken",
        Allowance.SERVICE_ACCOUNT,
    ),
    (
        _spec(prefill=_template({"hostPID": True})),
        "spec.prefill.podTemplate.spec.hostPID",
        Allowance.HOST_NAMESPACES,
    ),
    (
        _spec(router=_template({"hostIPC": True})),
        "spec.router.podTemplate.spec.hostIPC",
        Allowance.HOST_NAMESPACES,
    ),
    (_spec(transfer={"hostNetwork": True}), "spec.transfer.hostNetwork", Allowance.HOST_NAMESPACES),
    (
        _spec(decode=_template({"nodeName": "gpu-7"})),
        "spec.decode.podTemplate.spec.nodeName",
        Allowance.NODE_NAME,
    ),
    (
        _spec(prefill=_template({"containers": [{**SIDECAR, "securityContext": {"privileged": True}}]})),
        "spec.prefill.podTemplate.spec.containers[0].securityContext.privileged",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            prefill=_template(
                {"initContainers": [{**SIDECAR, "securityContext": {"allowPrivilegeEscalation": True}}]}
            )
        ),
        "spec.prefill.podTemplate.spec.initContainers[0].securityContext.allowPrivilegeEscalation",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            prefill=_template(
                {"containers": [{"name": "runtime", "securityContext": {"procMount": "Unmasked"}}]}
            )
        ),
        "spec.prefill.podTemplate.spec.containers[0].securityContext.procMount",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            decode=_template(
                {
                    "containers": [
                        {"name": "runtime", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}
                    ]
                }
            )
        ),
        "spec.decode.podTemplate.spec.containers[0].securityContext.capabilities.add",
        Allowance.CAPABILITIES,
    ),
    (
        _spec(prefill=_template({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})),
        "spec.prefill.podTemplate.spec.volumes[0].hostPath",
        Allowance.HOST_PATH,
    ),
    (_spec(model={"path": ".", "hostPath": {"path": "/models"}}), "spec.model.hostPath", Allowance.HOST_PATH),
    (
        _spec(model={"path": "org/m", "huggingFace": {"cache": {"hostPath": "/var/cache/hf"}}}),
        "spec.model.huggingFace.cache.hostPath",
        Allowance.HOST_PATH,
    ),
    (
        _spec(
            prefill=_template(
                {
                    "volumes": [
                        {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}
                    ]
                }
            )
        ),
        "spec.prefill.podTemplate.spec.volumes[0].projected.sources[0].serviceAccountToken",
        Allowance.SERVICE_ACCOUNT_TOKEN,
    ),
    (
        _spec(prefill=_template({"volumes": [{"name": "s", "secret": {"secretName": "db-password"}}]})),
        "spec.prefill.podTemplate.spec.volumes[0].secret.secretName",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(
            prefill=_template(
                {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "db-password"}}]}}]}
            )
        ),
        "spec.prefill.podTemplate.spec.volumes[0].projected.sources[0].secret.name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(
            prefill=_template(
                {"volumes": [{"name": "c", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "k"}}}]}
            )
        ),
        "spec.prefill.podTemplate.spec.volumes[0].csi.nodePublishSecretRef.name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(
            router=_template(
                {
                    "containers": [
                        {
                            **SIDECAR,
                            "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}],
                        }
                    ]
                }
            )
        ),
        "spec.router.podTemplate.spec.containers[0].env[0].valueFrom.secretKeyRef.name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(prefill=_template({"containers": [{**SIDECAR, "envFrom": [{"secretRef": {"name": "db"}}]}]})),
        "spec.prefill.podTemplate.spec.containers[0].envFrom[0].secretRef.name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(decode=_template({"imagePullSecrets": [{"name": "other-team-registry"}]})),
        "spec.decode.podTemplate.spec.imagePullSecrets[0].name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(decode={"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]}),
        "spec.decode.env[0].valueFrom.secretKeyRef.name",
        Allowance.OTHER_SECRETS,
    ),
    (
        _spec(model={"path": "org/m", "huggingFace": {"tokenSecretRef": {"name": "hf"}}}),
        "spec.model.huggingFace.tokenSecretRef.name",
        Allowance.OTHER_SECRETS,
    ),
]


@pytest.mark.parametrize(("spec", "field", "allowance"), CASES, ids=[c[1] for c in CASES])
def test_each_power_is_refused_with_its_field_named_unless_allowed(
    spec: dict[str, Any], field: str, allowance: Allowance
) -> None:
    [message] = _refused(spec)
    assert message.startswith(f"{field}: "), message
    assert allowance.value in message
    assert _refused(spec, frozenset({allowance})) == []
    others = frozenset(Allowance) - {allowance}
    assert len(_refused(spec, others)) == 1, "only its own allowance lets it through"


def test_a_plain_model_and_harmless_templates_need_nothing() -> None:
    harmless = _spec(
        prefill=_template(
            {
                "automountServiceAccountToken": False,
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "priorityClassName": "high",
                "containers": [{"name": "runtime", "securityContext": {"allowPrivilegeEscalation": False}}],
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "own", "secret": {"secretName": "web-tls"}},
                ],
            }
        ),
        model={"path": "org/m", "huggingFace": {"tokenSecretRef": {"name": "web"}}},
    )
    assert _refused(_spec()) == []
    assert _refused(harmless) == []


def test_secrets_named_after_another_model_are_not_the_models_own() -> None:
    # "web-cache" belongs to model web-cache as much as to web; only "web" and "web-..." are web's
    spec = _spec(prefill=_template({"volumes": [{"name": "s", "secret": {"secretName": "webcache"}}]}))
    assert len(_refused(spec)) == 1


def test_fault_injection_is_allowed_only_by_the_installation_and_never_with_sglang() -> None:
    ask = {contract.ANNOTATION_ALLOW_FAULT_INJECTION: "true"}
    [message] = _refused(_spec(), annotations=ask)
    assert "faultInjection" in message
    assert _refused(_spec(), frozenset({Allowance.FAULT_INJECTION}), annotations=ask) == []
    [never] = _refused(_spec(engine="sglang"), frozenset(Allowance), annotations=ask)
    assert "never served with engine sglang" in never


def test_every_use_is_reported_not_only_the_first() -> None:
    spec = _spec(
        prefill=_template({"hostPID": True, "nodeName": "n"}),
        decode=_template({"serviceAccountName": "x"}),
    )
    assert len(_refused(spec)) == 3


def test_per_namespace_allowances_add_to_the_global_ones() -> None:
    policy = PodPolicy(
        allow=frozenset({Allowance.NODE_NAME}), namespaces={"rdma": frozenset({Allowance.HOST_NAMESPACES})}
    )
    assert policy.allowed("rdma") == {Allowance.NODE_NAME, Allowance.HOST_NAMESPACES}
    assert policy.allowed("web") == {Allowance.NODE_NAME}


def test_the_charts_values_list_the_same_allowances() -> None:
    schema = json.loads((ROOT / "charts" / "pdwarden" / "values.schema.json").read_text())
    assert schema["definitions"]["allowances"]["items"]["enum"] == [a.value for a in Allowance]
    values = (ROOT / "charts" / "pdwarden" / "values.yaml").read_text()
    for allowance in Allowance:
        assert f"#   {allowance.value} " in values, f"values.yaml does not document {allowance.value}"


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_runs_under_the_default_policy(example: Path) -> None:
    doc = yaml.safe_load(example.read_text())
    meta = doc["metadata"]
    assert (
        podpolicy.violations(parse_spec(doc["spec"]), meta["name"], meta.get("annotations") or {}, NONE) == []
    )
