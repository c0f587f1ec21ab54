"""The installation's pod policy: every power a template can take is refused with its field
named, unless the installation allows it (everywhere or in the model's namespace)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import pdwarden_contract as contract
from pdwarden_operator import podpolicy
from pdwarden_operator.models import NAME_PATTERN, parse_spec
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
    spec: dict[str, Any],
    allowed: frozenset[Allowance] = NONE,
    annotations: dict[str, str] | None = None,
    model: str = "web",
) -> list[str]:
    return podpolicy.violations(parse_spec(spec), model, annotations or {}, allowed)


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
    (
        _spec(
            router=_template(
                {"containers": [{**SIDECAR, "ports": [{"containerPort": 8080, "hostPort": 80}]}]}
            )
        ),
        "spec.router.podTemplate.spec.containers[0].ports[0].hostPort",
        Allowance.HOST_NAMESPACES,
    ),
    (
        _spec(prefill=_template({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
        "spec.prefill.podTemplate.spec.securityContext.seccompProfile.type",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            decode=_template(
                {
                    "containers": [
                        {"name": "runtime", "securityContext": {"appArmorProfile": {"type": "Unconfined"}}}
                    ]
                }
            )
        ),
        "spec.decode.podTemplate.spec.containers[0].securityContext.appArmorProfile.type",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            prefill={
                "podTemplate": {
                    "metadata": {
                        "annotations": {
                            "container.apparmor.security.beta.kubernetes.io/runtime": "unconfined"
                        }
                    }
                }
            }
        ),
        "spec.prefill.podTemplate.metadata.annotations[container.apparmor.security.beta.kubernetes.io/runtime]",
        Allowance.PRIVILEGED,
    ),
    (
        _spec(
            prefill=_template(
                {"securityContext": {"sysctls": [{"name": "kernel.shm_rmid_forced", "value": "0"}]}}
            )
        ),
        "spec.prefill.podTemplate.spec.securityContext.sysctls",
        Allowance.PRIVILEGED,
    ),
    *(
        (
            _spec(decode=_template({"volumes": [{"name": "v", kind: source}]})),
            f"spec.decode.podTemplate.spec.volumes[0].{kind}",
            Allowance.HOST_PATH,
        )
        for kind, source in (
            ("nfs", {"server": "10.0.0.1", "path": "/"}),
            ("iscsi", {"targetPortal": "10.0.0.1:3260", "iqn": "iqn.2001-04.com.example:t", "lun": 0}),
            ("gitRepo", {"repository": "https://git.example/r.git"}),
        )
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
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [
                    {
                        "name": "runtime",
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "appArmorProfile": {"type": "RuntimeDefault"},
                        },
                    },
                    {**SIDECAR, "ports": [{"containerPort": 9000}]},
                ],
                "volumes": [
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "own", "secret": {"secretName": "web.tls"}},
                ],
            }
        ),
        model={"path": "org/m", "huggingFace": {"tokenSecretRef": {"name": "web"}}},
    )
    assert _refused(_spec()) == []
    assert _refused(harmless) == []


def _mounting(secret: str) -> dict[str, Any]:
    return _spec(prefill=_template({"volumes": [{"name": "s", "secret": {"secretName": secret}}]}))


def test_secrets_named_after_another_model_are_not_the_models_own() -> None:
    # "webcache" and "web-cache..." may belong to models webcache and web-cache; only "web" and
    # "web.<anything>" are web's
    assert len(_refused(_mounting("webcache"))) == 1
    assert len(_refused(_mounting("web-cache.token"))) == 1


@pytest.mark.parametrize("secret", ["llama-70b-hf-token", "llama-70b.hf-token", "llama-70b-worker-key-x7k2p"])
def test_a_model_cannot_use_a_longer_named_models_secrets(secret: str) -> None:
    [message] = _refused(_mounting(secret), model="llama")
    assert message.startswith("spec.prefill.podTemplate.spec.volumes[0].secret.secretName: "), message
    assert f"{secret!r}" in message and "named llama or llama.<anything>" in message, message
    assert "otherSecrets" in message


@pytest.mark.parametrize("secret", ["llama", "llama.hf-token", "llama.tls.v2"])
def test_a_models_own_secrets_are_its_name_and_its_name_dot_anything(secret: str) -> None:
    assert _refused(_mounting(secret), model="llama") == []
    tokened = _spec(model={"path": "org/m", "huggingFace": {"tokenSecretRef": {"name": secret}}})
    assert _refused(tokened, model="llama") == []


def test_no_model_name_holds_a_dot_so_no_other_model_owns_a_dotted_prefix() -> None:
    # what makes "<model>." a prefix of no other model's Secrets
    assert re.fullmatch(NAME_PATTERN, "llama-70b")
    assert not re.fullmatch(NAME_PATTERN, "llama.70b")


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
