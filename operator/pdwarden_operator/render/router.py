"""The router's pods: smg behind `pdwarden runtime router`'s gate, its command and the smg
arguments it owns, its API credentials, its Deployment."""

from __future__ import annotations

from typing import Final

import pdwarden_contract as contract
from pdwarden_operator import podtemplate, worker_key_secret
from pdwarden_operator.models import DisaggregatedModelSpec
from pdwarden_operator.render.kinds import DEPLOYMENT
from pdwarden_operator.render.meta import (
    Obj,
    Owner,
    child_metadata,
    child_name,
    labels,
    selector_labels,
    served_name,
)
from pdwarden_operator.render.pods import (
    container_resources,
    container_security_context,
    http_probe,
    pod_identity_env,
    pod_security_context,
    spread_constraints,
    tmp_volume,
)
from pdwarden_operator.render.worker_key import mount_worker_key, router_key
from pdwarden_operator.resource.containers import ResourceRequirements
from pdwarden_operator.resource.router import ROUTER_DEFAULT_RESOURCES

ROUTER_CONTAINER = podtemplate.ROUTER_CONTAINER


def _selector_args(model: str, role: str, grouped: bool = False) -> list[str]:
    """The router discovers a group by its leader (rank 0: the StatefulSet's ordinal 0), which
    is ready only once every rank of its group has joined."""
    leader = {contract.LABEL_POD_INDEX: "0"} if grouped else {}
    return [f"{k}={v}" for k, v in {**selector_labels(model, role), **leader}.items()]


# SGLang's router (the model gateway, smg) as a module of the router image's Python.
ROUTER_MODULE: Final = "smg.launch_router"
# Its retry and circuit-breaker behaviour, set explicitly (resource/router.py,
# ROUTER_RESILIENCE_OWNED_ARGS: spec.router.args may not change them). A retry is a new PD
# attempt: a new pair and a new bootstrap_room, so it never writes one request's KV into
# another's decode pages. smg retries 408, 429, 500, 502, 503 and 504; the runtime answers 503
# for a room its deadline failed and while it stops. But smg picks the retry's pair by the same
# policy (cache_aware: the same prefix, the same pair), so the breaker is what sends it
# elsewhere: two failed attempts within ten seconds open both of their workers (smg counts a PD
# attempt's status against both) for a second, during which retries go to another pair; then
# one trial request either closes the breaker (a healthy partner blamed with the wedged pod) or
# opens it again (the wedged pod; that trial is retried the same way). One failure does not
# open it: with every decode blamed at once (a burst of failures through one wedged prefill)
# smg answers 503 "no available workers" at once, without retrying (the router pod's gate sends
# such a request again once the breaker lets one through: gate_replay.py). Five attempts with
# backoff (100 ms doubling, at most 1 s) give a retry room to find another pair (docs/wedges.md,
# "What a client still sees").
ROUTER_RESILIENCE_ARGS: Final = (
    "--retry-max-retries",
    "5",
    "--retry-initial-backoff-ms",
    "100",
    "--retry-max-backoff-ms",
    "1000",
    "--retry-backoff-multiplier",
    "2",
    "--retry-jitter-factor",
    "0.2",
    "--cb-failure-threshold",
    "2",
    "--cb-success-threshold",
    "1",
    "--cb-timeout-duration-secs",
    str(contract.ROUTER_BREAKER_OPEN_S),
    "--cb-window-duration-secs",
    "10",
)
# Whether a worker serves is the pods' readiness probes' and the watchdog's to say, never smg's:
# smg's own health checks (every 60 s, 5 s timeout, 3 failures) would take a live worker that is
# slow to answer (a CPU-starved node) out of routing, and under discovery smg by default also
# removes an unhealthy worker from its registry. Discovery (pod readiness) decides which
# workers smg has; retries cover a worker that fails a request meanwhile.
ROUTER_HEALTH_ARGS: Final = ("--disable-health-check", "--no-remove-unhealthy-workers")


def router_command(owner: Owner, spec: DisaggregatedModelSpec) -> list[str]:
    """smg in PD mode, discovering workers by pod labels in its namespace, on loopback behind
    `pdwarden runtime router`'s gate: the gate passes only the serving routes (smg's control
    plane answers no client) and presents the worker key, when the model has one, for every
    client."""
    pod_ip = f"$({contract.ENV_POD_IP})"
    smg = [
        "python",
        "-m",
        ROUTER_MODULE,
        "--host",
        "127.0.0.1",
        "--port",
        str(contract.ROUTER_LOOPBACK_PORT),
        "--pd-disaggregation",
        "--policy",
        spec.router.policy,
        "--service-discovery",
        "--service-discovery-namespace",
        f"$({contract.ENV_POD_NAMESPACE})",
        "--service-discovery-port",
        str(spec.transfer.port(contract.DEFAULT_HTTP_PORT)),
        "--prefill-selector",
        *_selector_args(owner.name, contract.ROLE_PREFILL, spec.prefill.grouped),
        "--decode-selector",
        *_selector_args(owner.name, contract.ROLE_DECODE, spec.decode.grouped),
        "--prometheus-host",
        pod_ip,
        "--prometheus-port",
        str(contract.ROUTER_METRICS_PORT),
        *ROUTER_RESILIENCE_ARGS,
        *ROUTER_HEALTH_ARGS,
        *spec.router.args,
    ]
    gate = ["pdwarden", "runtime", "router", "--host", pod_ip, "--port", str(contract.ROUTER_HTTP_PORT)]
    gate += ["--router-port", str(contract.ROUTER_LOOPBACK_PORT)]
    # smg routes by model under discovery: the gate names the model in a native /generate body
    # that names none (one model behind one router)
    gate += ["--served-model-name", served_name(owner, spec)]
    if router_key(owner, spec) is not None:
        gate += ["--worker-key-file", worker_key_secret.KEY_FILE]
    return [*gate, "--", *smg]


def _router_resources(res: ResourceRequirements | None) -> Obj:
    """The router's defaults, overridden key by key by router.resources."""
    given = container_resources(res)
    return {
        part: {**ROUTER_DEFAULT_RESOURCES[part], **given.get(part, {})} for part in ROUTER_DEFAULT_RESOURCES
    }


# Where a pod's API credentials are read by every Kubernetes client (smg's included).
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# A bound token's life; the kubelet renews it at 80 % (the API server's default for the
# volume the ServiceAccount admission plugin adds).
TOKEN_EXPIRATION_S: Final = 3607


def router_token_volume() -> tuple[Obj, Obj]:
    """(volume, mount) of the router's API credentials for its container alone: what the
    ServiceAccount admission plugin mounts into every container of a pod with automount on
    (a bound token, the cluster's CA, the namespace), so that no sidecar reads pods."""
    volume = {
        "name": podtemplate.ROUTER_TOKEN_VOLUME,
        "projected": {
            "defaultMode": 0o444,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_S}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }
    mount = {"name": podtemplate.ROUTER_TOKEN_VOLUME, "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": True}
    return volume, mount


def router_deployment(owner: Owner, spec: DisaggregatedModelSpec) -> Obj:
    role = contract.ROLE_ROUTER
    tmp, tmp_mount = tmp_volume()
    token, token_mount = router_token_volume()
    volumes, mounts = [tmp, token], [tmp_mount, token_mount]
    mount_worker_key(router_key(owner, spec), volumes, mounts)
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
            *pod_identity_env(),
        ],
        "resources": _router_resources(spec.router.resources),
        # Liveness only after the router has started (slow on a busy node); /readiness
        # answers 503 until the router has healthy prefill and decode workers.
        "startupProbe": http_probe("/liveness", contract.PORT_NAME_HTTP, 2, 150),
        "readinessProbe": http_probe("/readiness", contract.PORT_NAME_HTTP, 5, 3),
        "livenessProbe": http_probe("/liveness", contract.PORT_NAME_HTTP, 10, 3),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    template = {
        "metadata": {"labels": labels(owner.name, role)},
        "spec": {
            "serviceAccountName": child_name(owner.name, role),
            # Discovery reads pods with this account's token, mounted into the router container
            # only (router_token_volume): a sidecar gets none.
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(),
            "topologySpreadConstraints": spread_constraints(owner.name, role),
            "volumes": volumes,
            "containers": [container],
            "terminationGracePeriodSeconds": 30,
        },
    }
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": child_metadata(owner, child_name(owner.name, role), role),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, role)},
            "template": podtemplate.merge(template, spec.router.pod_template),
        },
    }
