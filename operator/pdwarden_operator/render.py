"""Children of a DisaggregatedModel, as plain dicts ready for server-side apply.

Pure functions: same input, same output, no API calls. Names are deterministic
(`<name>-prefill`, `<name>-decode`, `<name>-router`), so re-applying after a crash or a
restart updates the same objects instead of creating duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdwarden_operator.models import GPU_RESOURCE, DisaggregatedModelSpec, ResourceRequirements, RoleSpec
from pdwarden_runtime import contract

Obj = dict[str, Any]

RUNTIME_CONTAINER = "runtime"
ROUTER_CONTAINER = "router"
APP_NAME = "pdwarden"


@dataclass(frozen=True)
class Owner:
    """What the children need to know about their DisaggregatedModel besides its spec."""

    name: str
    namespace: str
    uid: str
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Any) -> Owner:
        meta = body["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            annotations=dict(meta.get("annotations") or {}),
        )

    @property
    def allow_fault_injection(self) -> bool:
        return self.annotations.get(contract.ANNOTATION_ALLOW_FAULT_INJECTION, "").lower() == "true"

    def owner_reference(self) -> Obj:
        return {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def child_name(model: str, role: str) -> str:
    return f"{model}-{role}"


def selector_labels(model: str, role: str) -> dict[str, str]:
    """The immutable Deployment selector; also what the router's discovery matches."""
    return {contract.LABEL_MODEL: model, contract.LABEL_ROLE: role}


def labels(model: str, role: str) -> dict[str, str]:
    return {
        **selector_labels(model, role),
        contract.LABEL_APP_NAME: APP_NAME,
        contract.LABEL_APP_INSTANCE: model,
        contract.LABEL_APP_COMPONENT: role,
        contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
    }


def _metadata(owner: Owner, name: str, role: str) -> Obj:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, role),
        "ownerReferences": [owner.owner_reference()],
    }


def served_name(owner: Owner, spec: DisaggregatedModelSpec) -> str:
    return spec.model.served_name or owner.name


# --- runtime (prefill / decode) -------------------------------------------------------------


def runtime_command(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> list[str]:
    """The command every runtime pod runs (parsed by ``pdwarden_runtime.cli``'s ``serve``)."""
    role_spec = spec.role(role)
    cmd = [
        "pdwarden",
        "runtime",
        "serve",
        "--role",
        role,
        "--engine",
        spec.engine,
        "--host",
        f"$({contract.ENV_POD_IP})",
        "--port",
        str(contract.DEFAULT_HTTP_PORT),
        "--bootstrap-port",
        str(contract.DEFAULT_BOOTSTRAP_PORT),
        "--metrics-port",
        str(contract.DEFAULT_METRICS_PORT),
        "--inflight-deadline",
        str(spec.transfer.inflight_deadline_seconds),
        "--transfer-deadline",
        str(spec.transfer.transfer_deadline_seconds),
    ]
    if owner.allow_fault_injection:
        cmd.append("--allow-fault-injection")
    if spec.engine == "synthetic":
        return cmd + list(role_spec.args)
    return [
        *cmd,
        "--",
        "--model-path",
        spec.model.path,
        "--served-model-name",
        served_name(owner, spec),
        "--tp",
        str(role_spec.tensor_parallel),
        *role_spec.args,
    ]


def _field_env(name: str, path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _pod_identity_env() -> list[Obj]:
    """POD_IP, POD_NAME, POD_NAMESPACE from the downward API (runtime and router pods)."""
    return [
        _field_env(contract.ENV_POD_IP, "status.podIP"),
        _field_env(contract.ENV_POD_NAME, "metadata.name"),
        _field_env(contract.ENV_POD_NAMESPACE, "metadata.namespace"),
    ]


def runtime_env(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> list[Obj]:
    env = [
        *_pod_identity_env(),
        {"name": contract.ENV_ROLE, "value": role},
        {"name": contract.ENV_MODEL, "value": served_name(owner, spec)},
    ]
    if spec.transfer.ucx_transports:
        env.append({"name": "UCX_TLS", "value": spec.transfer.ucx_transports})
    for var in spec.role(role).env:
        env.append(var.model_dump(by_alias=True, exclude_none=True))
    return env


def _resources(res: ResourceRequirements | None, gpus: int = 0) -> Obj:
    out: Obj = {}
    if res is not None:
        if res.requests:
            out["requests"] = {k: str(v) for k, v in res.requests.items()}
        if res.limits:
            out["limits"] = {k: str(v) for k, v in res.limits.items()}
    if gpus > 0:
        # Extended resources are requested through limits (requests default to them).
        out["limits"] = {**out.get("limits", {}), GPU_RESOURCE: str(gpus)}
    return out


def _http_probe(path: str, port: str, period: int, failures: int) -> Obj:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _runtime_probes(spec: DisaggregatedModelSpec) -> Obj:
    # Loading a real model takes minutes: the startup probe allows up to an hour, after
    # which liveness takes over. The synthetic engine needs seconds to a few minutes (it
    # imports SGLang's transfer code; a busy CPU-only node is slow).
    startup_failures = 360 if spec.engine == "sglang" else 150
    startup_period = 10 if spec.engine == "sglang" else 2
    http = contract.PORT_NAME_HTTP
    return {
        "startupProbe": _http_probe(contract.HEALTH_PATH, http, startup_period, startup_failures),
        "readinessProbe": _http_probe(contract.HEALTH_PATH, http, 5, 3),
        "livenessProbe": _http_probe(contract.HEALTH_PATH, http, 10, 3),
    }


def _runtime_ports() -> list[Obj]:
    return [
        {"name": contract.PORT_NAME_HTTP, "containerPort": contract.DEFAULT_HTTP_PORT, "protocol": "TCP"},
        {
            "name": contract.PORT_NAME_BOOTSTRAP,
            "containerPort": contract.DEFAULT_BOOTSTRAP_PORT,
            "protocol": "TCP",
        },
        {
            "name": contract.PORT_NAME_METRICS,
            "containerPort": contract.DEFAULT_METRICS_PORT,
            "protocol": "TCP",
        },
    ]


def runtime_deployment(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> Obj:
    role_spec: RoleSpec = spec.role(role)
    pod_annotations = {
        # sglang-router's service discovery reads the prefill bootstrap port from here.
        contract.ANNOTATION_BOOTSTRAP_PORT: str(contract.DEFAULT_BOOTSTRAP_PORT),
    }
    container: Obj = {
        "name": RUNTIME_CONTAINER,
        "image": spec.image,
        "command": runtime_command(owner, spec, role),
        "ports": _runtime_ports(),
        "env": runtime_env(owner, spec, role),
        "resources": _resources(role_spec.resources, role_spec.gpus),
        **_runtime_probes(spec),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "replicas": role_spec.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "template": {
                "metadata": {"labels": labels(owner.name, role), "annotations": pod_annotations},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 30},
            },
        },
    }


# --- router -----------------------------------------------------------------------------------


def _selector_args(model: str, role: str) -> list[str]:
    return [f"{k}={v}" for k, v in selector_labels(model, role).items()]


def router_command(owner: Owner, spec: DisaggregatedModelSpec) -> list[str]:
    """sglang-router 0.3.2 in PD mode, discovering workers by pod labels in its namespace."""
    pod_ip = f"$({contract.ENV_POD_IP})"
    return [
        "python",
        "-m",
        "sglang_router.launch_router",
        "--host",
        pod_ip,
        "--port",
        str(contract.ROUTER_HTTP_PORT),
        "--pd-disaggregation",
        "--policy",
        spec.router.policy,
        "--service-discovery",
        "--service-discovery-namespace",
        f"$({contract.ENV_POD_NAMESPACE})",
        "--service-discovery-port",
        str(contract.DEFAULT_HTTP_PORT),
        "--prefill-selector",
        *_selector_args(owner.name, contract.ROLE_PREFILL),
        "--decode-selector",
        *_selector_args(owner.name, contract.ROLE_DECODE),
        "--prometheus-host",
        pod_ip,
        "--prometheus-port",
        str(contract.ROUTER_METRICS_PORT),
        *spec.router.args,
    ]


def router_deployment(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    role = contract.ROLE_ROUTER
    container: Obj = {
        "name": ROUTER_CONTAINER,
        "image": spec.router.image or spec.image,
        "command": router_command(owner, spec),
        "ports": [
            {"name": contract.PORT_NAME_HTTP, "containerPort": contract.ROUTER_HTTP_PORT, "protocol": "TCP"},
            {
                "name": contract.PORT_NAME_METRICS,
                "containerPort": contract.ROUTER_METRICS_PORT,
                "protocol": "TCP",
            },
        ],
        "env": [
            *_pod_identity_env(),
        ],
        "resources": _resources(spec.router.resources),
        # Liveness only after the router has started (slow on a busy node); /readiness
        # answers 503 until the router has healthy prefill and decode workers.
        "startupProbe": _http_probe("/liveness", contract.PORT_NAME_HTTP, 2, 150),
        "readinessProbe": _http_probe("/readiness", contract.PORT_NAME_HTTP, 5, 3),
        "livenessProbe": _http_probe("/liveness", contract.PORT_NAME_HTTP, 10, 3),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "template": {
                "metadata": {"labels": labels(owner.name, role)},
                "spec": {
                    "serviceAccountName": child_name(owner.name, role),
                    "containers": [container],
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
    }


def router_service_account(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
    }


def router_role(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        # Service discovery only reads pods in its own namespace.
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }


def router_role_binding(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    name = child_name(owner.name, role)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(owner, name, role),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
    }


def router_service(owner: Owner) -> Obj:
    role = contract.ROLE_ROUTER
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner.name, role),
            "ports": [
                {
                    "name": contract.PORT_NAME_HTTP,
                    "port": contract.ROUTER_HTTP_PORT,
                    "targetPort": contract.PORT_NAME_HTTP,
                    "protocol": "TCP",
                },
                {
                    "name": contract.PORT_NAME_METRICS,
                    "port": contract.ROUTER_METRICS_PORT,
                    "targetPort": contract.PORT_NAME_METRICS,
                    "protocol": "TCP",
                },
            ],
        },
    }


def pod_disruption_budget(owner: Owner, spec: DisaggregatedModelSpec, role: str) -> Obj:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "maxUnavailable": spec.watchdog.max_unavailable,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
        },
    }


ROLES = (contract.ROLE_PREFILL, contract.ROLE_DECODE, contract.ROLE_ROUTER)


def render_children(owner: Owner, spec: DisaggregatedModelSpec) -> list[Obj]:
    """Every child of one DisaggregatedModel; `kube.apply.apply_all` applies them all at once."""
    return [
        runtime_deployment(owner, spec, contract.ROLE_PREFILL),
        runtime_deployment(owner, spec, contract.ROLE_DECODE),
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        router_deployment(owner, spec),
        router_service(owner),
        *(pod_disruption_budget(owner, spec, role) for role in ROLES),
    ]


def child_key(obj: Obj) -> tuple[str, str]:
    """(kind, name): how children are matched with what the cluster holds."""
    return obj["kind"], obj["metadata"]["name"]
