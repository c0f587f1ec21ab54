"""The contract between the runtime (inside every prefill/decode pod) and the operator.

The operator imports names from here and nothing else from the runtime (and the runtime
nothing from the operator); the chart's alert rules and dashboard name these metrics and are
tested against them. Renaming a metric, a port or a label is one edit in one file.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, get_args

# --- Kubernetes API group of the DisaggregatedModel resource -------------------------
API_GROUP: Final = "pdwarden.io"
API_VERSION: Final = "v1alpha1"
KIND: Final = "DisaggregatedModel"
PLURAL: Final = "disaggregatedmodels"
SHORT_NAME: Final = "dm"

# --- Roles --------------------------------------------------------------------------


class Role(StrEnum):
    """A DisaggregatedModel's roles, the one list of them. The tuples and names below carry
    the values, plain strings: they go into labels, flags, status keys and metric labels, and
    into rendered objects that YAML and marshal (the child store) take only as plain strings;
    a role read back (a label, a flag) is `Role(value)`."""

    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"  # the front door (SGLang's router): no pdwarden runtime in its pods

    @property
    def runtime(self) -> bool:
        """Whether the role's pods run the pdwarden runtime (the watchdog scrapes them)."""
        return self is not Role.ROUTER


ROLES: Final = tuple(role.value for role in Role)
RUNTIME_ROLES: Final = tuple(role.value for role in Role if role.runtime)
ROLE_PREFILL: Final = Role.PREFILL.value
ROLE_DECODE: Final = Role.DECODE.value
ROLE_ROUTER: Final = Role.ROUTER.value
# The role label of a runtime pod the watchdog drains: no Deployment selector and no router
# discovery matches it any more; LABEL_QUARANTINED_ROLE keeps the role it served.
ROLE_QUARANTINED: Final = "quarantined"

# --- Engines and deadlines of a runtime pod (the spec's fields and the runtime's flags) ---
# synthetic: a CPU stand-in with the same HTTP and metrics surface (no model); sglang: SGLang
# itself with the NIXL hardening installed.
Engine = Literal["synthetic", "sglang"]
ENGINES: Final[tuple[Engine, ...]] = get_args(Engine)
# Seconds a room may wait for or move KV, and a KV chunk's NIXL writes may stay in progress,
# before the runtime fails the room (spec.transfer's defaults and the runtime's).
DEFAULT_INFLIGHT_DEADLINE_S: Final = 300
DEFAULT_TRANSFER_DEADLINE_S: Final = 60

# --- The runtime pod's command ---------------------------------------------------------
# `pdwarden runtime serve`, as the operator renders it for every runtime pod and the runtime's
# command line declares it: a flag renamed here is renamed on both sides.
SERVE_COMMAND: Final = ("pdwarden", "runtime", "serve")


class ServeFlag(StrEnum):
    ROLE = "--role"
    ENGINE = "--engine"
    HOST = "--host"
    PORT = "--port"
    BOOTSTRAP_PORT = "--bootstrap-port"
    METRICS_PORT = "--metrics-port"
    INFLIGHT_DEADLINE = "--inflight-deadline"
    TRANSFER_DEADLINE = "--transfer-deadline"
    WORKER_KEY_FILE = "--worker-key-file"
    # while a key rotates: another key the pod accepts (the side channel's proofs, the bearer)
    WORKER_KEY_ACCEPT_FILE = "--worker-key-accept-file"
    # while a key is switched on or off: the side channel also takes what carries no proof
    SIDE_CHANNEL_LENIENT = "--side-channel-lenient"
    ALLOW_FAULT_INJECTION = "--allow-fault-injection"
    # a group's pods (SGLang's own multi-node flags, which the runtime hands on)
    NNODES = "--nnodes"
    NODE_RANK = "--node-rank"
    DIST_INIT_ADDR = "--dist-init-addr"
    # the synthetic engine's served model name (SGLang's comes after `--`)
    MODEL = "--model"


# --- Pod labels and annotations -----------------------------------------------------
LABEL_MODEL: Final = "pdwarden.io/model"
LABEL_ROLE: Final = "pdwarden.io/role"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "pdwarden"
LABEL_APP_NAME: Final = "app.kubernetes.io/name"
LABEL_APP_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_APP_COMPONENT: Final = "app.kubernetes.io/component"
# Multi-node replicas: the group (its index within the role) and the pod's rank in it (0: the
# leader). Kubernetes' StatefulSet controller labels each pod with its ordinal (= the rank).
LABEL_GROUP: Final = "pdwarden.io/group"
LABEL_RANK: Final = "pdwarden.io/rank"
LABEL_POD_INDEX: Final = "apps.kubernetes.io/pod-index"
# The router's (smg's) service discovery reads the prefill bootstrap port from this annotation.
ANNOTATION_BOOTSTRAP_PORT: Final = "sglang.ai/bootstrap-port"
# Testing only: on a DisaggregatedModel, makes the operator start runtime pods with
# --allow-fault-injection so a test or the demo can inject a fault into ONE pod.
ANNOTATION_ALLOW_FAULT_INJECTION: Final = "pdwarden.io/allow-fault-injection"
# On a quarantined pod: the role it served, why it was quarantined (a label value) and when
# (RFC 3339), so an operator that finds it on start-up can finish its drain.
LABEL_QUARANTINED_ROLE: Final = "pdwarden.io/quarantined-role"
LABEL_QUARANTINE_REASON: Final = "pdwarden.io/quarantine-reason"
QUARANTINE_REASON_WEDGED: Final = "wedged"
ANNOTATION_QUARANTINED_AT: Final = "pdwarden.io/quarantined-at"
# On every child: a digest of the child as rendered when it was last applied (the operator's
# plan.py compares it).
ANNOTATION_RENDERED_DIGEST: Final = "pdwarden.io/rendered-digest"
# The leader operator's pod carries this label; the chart's Service for the external metrics
# APIService selects it.
LABEL_EXTERNAL_METRICS_SERVING: Final = "pdwarden.io/external-metrics"

# --- Container ports (names and defaults) -------------------------------------------
PORT_NAME_HTTP: Final = "http"
PORT_NAME_BOOTSTRAP: Final = "bootstrap"
PORT_NAME_METRICS: Final = "metrics"
DEFAULT_HTTP_PORT: Final = 30000
DEFAULT_BOOTSTRAP_PORT: Final = 8998
DEFAULT_METRICS_PORT: Final = 9400
# A group's ranks rendezvous at the leader on this port (SGLang's --dist-init-addr).
PORT_NAME_DIST: Final = "dist"
DEFAULT_DIST_INIT_PORT: Final = 5757
ROUTER_HTTP_PORT: Final = 8000
ROUTER_METRICS_PORT: Final = 29000
# With the model's worker key, smg listens on loopback here behind the router pod's gate.
ROUTER_LOOPBACK_PORT: Final = 28000
# smg's circuit breaker keeps a worker out this long after it opens (--cb-timeout-duration-secs,
# whole seconds); the router pod's gate waits out an open breaker by it.
ROUTER_BREAKER_OPEN_S: Final = 1
METRICS_PATH: Final = "/metrics"
# A query parameter of METRICS_PATH, repeated, as prometheus_client's own handlers take it: only
# the metric families with these sample names (the watchdog asks for the few it reads).
METRICS_NAME_PARAM: Final = "name[]"

# After SIGTERM a runtime or router pod goes on serving this long before it stops listening:
# SGLang's router (smg) drops a terminating pod from its workers about a second after the pod's
# deletion (it coalesces watch events for 1 s), and a Service's endpoints follow as quickly, so
# no request is sent to a closed port.
TERMINATION_DRAIN_S: Final = 5.0
# The largest request body a worker's HTTP port takes (a prompt).
MAX_REQUEST_BODY_BYTES: Final = 64 * 1024 * 1024

# --- HTTP surface of a runtime pod (SGLang-compatible subset) ------------------------
HEALTH_PATH: Final = "/health"
HEALTH_GENERATE_PATH: Final = "/health_generate"
GENERATE_PATH: Final = "/generate"
# Only served when the runtime runs with --allow-fault-injection.
FAULT_PATH: Final = "/debug/fault"
FAULT_NONE: Final = "none"
FAULT_EMULATED_PORT_RACE: Final = "emulated-maxstatus-port-race"
FAULT_STALL: Final = "stall-transfers"
FAULT_DROP_ABORT: Final = "drop-abort"
# Decode-side transfer stall: the decode keeps answering HTTP, but the KV of rooms it opens
# from then on goes to a NIXL agent of its own that never progresses (a stalled agent or
# NIC), so prefills sending to it see their handles stuck until their deadline.
FAULT_STALL_KV_RECEIVE: Final = "stall-kv-receive"
FAULTS: Final = (FAULT_NONE, FAULT_EMULATED_PORT_RACE, FAULT_STALL, FAULT_DROP_ABORT, FAULT_STALL_KV_RECEIVE)

# --- The model's worker key (router -> prefill and decode) ----------------------------
# A per-model key that every worker requires on its HTTP port, as SGLang's --api-key does
# (`Authorization: Bearer <key>`); paths under these prefixes stay open (probes, scrapes).
WORKER_KEY_OPEN_PREFIXES: Final = ("/health", "/metrics")
# The Secret the operator creates for it (`<model>-worker-key-<random>`), the key in it, and
# where the runtime and router pods mount it.
WORKER_KEY_SECRET_INFIX: Final = "worker-key"
WORKER_KEY_SECRET_KEY: Final = "key"
WORKER_KEY_DIR: Final = "/var/run/pdwarden/worker-key"
# While the key rotates, the other key a worker accepts (mounted beside the one it uses).
WORKER_KEY_ACCEPT_DIR: Final = "/var/run/pdwarden/worker-key-accept"

# --- Environment variables ------------------------------------------------------------
ENV_POD_IP: Final = "POD_IP"
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_ROLE: Final = "PDWARDEN_ROLE"
ENV_MODEL: Final = "PDWARDEN_MODEL"
# A group pod's rank (its StatefulSet ordinal, from the pod-index label).
ENV_NODE_RANK: Final = "PDWARDEN_NODE_RANK"
# A runtime pod's UID (downward API): a prefill says which pod it is, so a decode holding
# pages for it can match the operator's list of deleted pods.
ENV_POD_UID: Final = "POD_UID"
# Where a runtime pod finds the operator's list of the model's deleted runtime pods (a
# ConfigMap `<model>-gone-pods`, key GONE_PODS_KEY, mounted read-only).
ENV_GONE_PODS_FILE: Final = "PDWARDEN_GONE_PODS_FILE"
GONE_PODS_SUFFIX: Final = "gone-pods"
GONE_PODS_KEY: Final = "gone-pods.json"

# --- Metrics (runtime -> operator and alerts) ----------------------------------------
METRIC_INFLIGHT_REQUESTS: Final = "pdwarden_inflight_requests"
METRIC_INFLIGHT_OLDEST_AGE: Final = "pdwarden_inflight_oldest_age_seconds"
METRIC_KV_ROOMS: Final = "pdwarden_kv_rooms"
# prometheus_client appends `_total` to counters on exposition; the names below are the
# exposed sample names, the `*_BASE` names are what a Counter is constructed with.
METRIC_KV_TRANSFERS_TOTAL: Final = "pdwarden_kv_transfers_total"
METRIC_KV_TRANSFERS_BASE: Final = "pdwarden_kv_transfers"
METRIC_KV_TRANSFER_BYTES_TOTAL: Final = "pdwarden_kv_transfer_bytes_total"
METRIC_KV_TRANSFER_BYTES_BASE: Final = "pdwarden_kv_transfer_bytes"
METRIC_KV_TRANSFER_SECONDS: Final = "pdwarden_kv_transfer_seconds"
METRIC_STATUS_WRITES_REFUSED_TOTAL: Final = "pdwarden_kv_status_writes_refused_total"
METRIC_STATUS_WRITES_REFUSED_BASE: Final = "pdwarden_kv_status_writes_refused"
METRIC_RUNTIME_INFO: Final = "pdwarden_runtime_info"
# Age of the oldest room per non-terminal state, measured from when it ENTERED that state:
# a room waiting for bootstrap or its forward pass is queueing; only time in Transferring
# (or waiting for a prefill that stopped sending, on decode) means a transfer is stuck.
METRIC_KV_OLDEST_IN_STATE: Final = "pdwarden_kv_oldest_in_state_seconds"
# The `state` label values of pdwarden_kv_rooms and pdwarden_kv_oldest_in_state_seconds, one per
# SGLang KVPoll status (kvpoll.STATE_LABELS maps the statuses to these). Transferring is the one
# state the watchdog's age clause judges.
KV_STATE_FAILED: Final = "failed"
KV_STATE_BOOTSTRAPPING: Final = "bootstrapping"
KV_STATE_WAITING_FOR_INPUT: Final = "waiting_for_input"
KV_STATE_TRANSFERRING: Final = "transferring"
KV_STATE_SUCCESS: Final = "success"
KV_STATES: Final = (
    KV_STATE_FAILED,
    KV_STATE_BOOTSTRAPPING,
    KV_STATE_WAITING_FOR_INPUT,
    KV_STATE_TRANSFERRING,
    KV_STATE_SUCCESS,
)
# Liveness of the runtime's threads (SGLang's NIXL bootstrap, transfer workers, heartbeat;
# the synthetic engine's): alive count per thread kind, and the count that should be alive.
METRIC_RUNTIME_THREADS: Final = "pdwarden_runtime_threads"
METRIC_RUNTIME_THREADS_EXPECTED: Final = "pdwarden_runtime_threads_expected"
LABEL_METRIC_THREAD: Final = "thread"
# The `thread` label values: every kind of thread the runtime watches (its thread watch names
# them; its metrics export no other). The operator refuses a body with any other value.
THREAD_NIXL_BOOTSTRAP: Final = "nixl_bootstrap"
THREAD_NIXL_TRANSFER_WORKER: Final = "nixl_transfer_worker"
THREAD_NIXL_DECODE_LISTENER: Final = "nixl_decode_listener"
THREAD_NIXL_HEARTBEAT: Final = "nixl_heartbeat"
THREAD_PDWARDEN_QUARANTINE: Final = "pdwarden_quarantine"
THREAD_PDWARDEN_DEADLINE_REAPER: Final = "pdwarden_deadline_reaper"
THREAD_PDWARDEN_STOCK_MIRROR: Final = "pdwarden_stock_mirror"
RUNTIME_THREAD_KINDS: Final = (
    THREAD_NIXL_BOOTSTRAP,
    THREAD_NIXL_TRANSFER_WORKER,
    THREAD_NIXL_DECODE_LISTENER,
    THREAD_NIXL_HEARTBEAT,
    THREAD_PDWARDEN_QUARANTINE,
    THREAD_PDWARDEN_DEADLINE_REAPER,
    THREAD_PDWARDEN_STOCK_MIRROR,
)
# Exceptions caught in pdwarden's own hooks around SGLang's queues and threads.
METRIC_RUNTIME_ERRORS_TOTAL: Final = "pdwarden_runtime_errors_total"
METRIC_RUNTIME_ERRORS_BASE: Final = "pdwarden_runtime_errors"
LABEL_METRIC_WHERE: Final = "where"
# Transfer handles released at a deadline but possibly still writing (kept and polled).
METRIC_KV_HANDLES_QUARANTINED: Final = "pdwarden_kv_handles_quarantined"
# How quarantined handles ended, by `how`: the write finished (done), NIXL reported it
# failed (error), or the peer's connection was torn down (peer_gone).
METRIC_KV_QUARANTINE_ENDINGS_TOTAL: Final = "pdwarden_kv_quarantine_endings_total"
METRIC_KV_QUARANTINE_ENDINGS_BASE: Final = "pdwarden_kv_quarantine_endings"
LABEL_METRIC_HOW: Final = "how"
QUARANTINE_ENDED_DONE: Final = "done"
QUARANTINE_ENDED_ERROR: Final = "error"
QUARANTINE_ENDED_PEER_GONE: Final = "peer_gone"
QUARANTINE_ENDINGS: Final = (QUARANTINE_ENDED_DONE, QUARANTINE_ENDED_ERROR, QUARANTINE_ENDED_PEER_GONE)
# Rooms whose request has ended (the client left, a peer aborted, a deadline) that this pod
# still holds for a write that may land: on decode their pages, kept until the prefill's
# drain ACK; on prefill rooms with quarantined handles. Never a wedge of the pod holding them.
METRIC_KV_ROOMS_ABANDONED: Final = "pdwarden_kv_rooms_abandoned"
# Decode pages held per writer (`peer`: the prefill's IP) for requests that ended while a
# write may still land, and how long the oldest of them has been held: kept until that
# prefill's drain ACK or proof that it is gone, never freed on a timer.
METRIC_KV_PAGES_HELD: Final = "pdwarden_kv_pages_held"
METRIC_KV_PAGES_HELD_SECONDS: Final = "pdwarden_kv_pages_held_seconds"
# Pages of the pod's KV pool (what held pages are a share of).
METRIC_KV_POOL_PAGES: Final = "pdwarden_kv_pool_pages"
# Pages of the pod's KV pool allocated now (decode: what autoscaling's kvPagesInUse reads).
METRIC_KV_PAGES_IN_USE: Final = "pdwarden_kv_pages_in_use"
# New decode requests refused before any page was published to their prefill (`peer`: its
# IP; bounded, the rest under PEER_OTHER), by `reason`: the pages held for that writer are
# over the decode's bound (held_pages_over_bound), or its bootstrap server's answer naming a
# rank carried no valid proof of the model's key (unproven_route).
METRIC_KV_WRITER_REFUSED_TOTAL: Final = "pdwarden_kv_writer_refused_total"
METRIC_KV_WRITER_REFUSED_BASE: Final = "pdwarden_kv_writer_refused"
LABEL_METRIC_REASON: Final = "reason"
WRITER_REFUSED_HELD_PAGES: Final = "held_pages_over_bound"
WRITER_REFUSED_UNPROVEN_ROUTE: Final = "unproven_route"
WRITER_REFUSED_REASONS: Final = (WRITER_REFUSED_HELD_PAGES, WRITER_REFUSED_UNPROVEN_ROUTE)
# Decode-side page verification failures (synthetic engine): corrupted KV pages seen.
METRIC_KV_VERIFY_FAILURES_TOTAL: Final = "pdwarden_kv_verify_failures_total"
METRIC_KV_VERIFY_FAILURES_BASE: Final = "pdwarden_kv_verify_failures"

# Per-peer transfer figures (bounded: a fixed number of peers, the rest under PEER_OTHER,
# idle peers forgotten). `peer` is the peer pod's IP as the runtime knows it (prefill: the
# decode endpoint in its transfer info; decode: the prefill's bootstrap host), which the
# operator maps to a pod by status.podIP. Outcomes are OUTCOMES.
METRIC_KV_PEER_INFLIGHT: Final = "pdwarden_kv_peer_inflight"
METRIC_KV_PEER_TRANSFERS_TOTAL: Final = "pdwarden_kv_peer_transfers_total"
METRIC_KV_PEER_TRANSFERS_BASE: Final = "pdwarden_kv_peer_transfers"
LABEL_METRIC_PEER: Final = "peer"
PEER_OTHER: Final = "other"

LABEL_METRIC_ROLE: Final = "role"
LABEL_METRIC_STATE: Final = "state"
LABEL_METRIC_OUTCOME: Final = "outcome"
LABEL_METRIC_FROM_STATE: Final = "from_state"
LABEL_METRIC_TO_STATE: Final = "to_state"

OUTCOME_SUCCESS: Final = "success"
OUTCOME_FAILED: Final = "failed"
OUTCOME_ABORTED: Final = "aborted"
OUTCOME_DEADLINE: Final = "deadline"
OUTCOMES: Final = (OUTCOME_SUCCESS, OUTCOME_FAILED, OUTCOME_ABORTED, OUTCOME_DEADLINE)

# --- Operator's own metrics (served by the operator, used by the chart's alerts) -------
METRIC_OPERATOR_WEDGED_PODS: Final = "pdwarden_operator_wedged_pods"
METRIC_OPERATOR_UNOBSERVED_PODS: Final = "pdwarden_operator_unobserved_pods"
METRIC_OPERATOR_REMEDIATIONS_TOTAL: Final = "pdwarden_operator_remediations_total"
METRIC_OPERATOR_SCRAPE_ERRORS_TOTAL: Final = "pdwarden_operator_scrape_errors_total"
METRIC_OPERATOR_SCRAPE_DURATION: Final = "pdwarden_operator_scrape_duration_seconds"
# Every model's watchdog round (observe, plan, act), operator-wide: its duration, and the rounds
# that took longer than their model's scrape interval (the next one then starts late).
METRIC_OPERATOR_ROUND_SECONDS: Final = "pdwarden_operator_watchdog_round_seconds"
METRIC_OPERATOR_ROUNDS_LATE_TOTAL: Final = "pdwarden_operator_watchdog_rounds_late_total"
METRIC_OPERATOR_BUDGET_EXHAUSTED: Final = "pdwarden_operator_remediation_budget_exhausted"
METRIC_OPERATOR_LEADER: Final = "pdwarden_operator_leader"
METRIC_OPERATOR_BRAKE_ENGAGED: Final = "pdwarden_operator_brake_engaged"
METRIC_OPERATOR_NAMESPACE_BRAKE_ENGAGED: Final = "pdwarden_operator_namespace_brake_engaged"  # {namespace}
# Abandoned rooms the model's pods report (METRIC_KV_ROOMS_ABANDONED), per role: named in the
# verdicts, never remediated.
METRIC_OPERATOR_ABANDONED_ROOMS: Final = "pdwarden_operator_abandoned_rooms"
# Autoscaling, per {namespace, model, role}: the Deployment's count, what the load alone asks
# for, 1 while at maxReplicas with more asked, and every scaling decision ({direction, reason});
# per {namespace, model}: 1 while spec.prefillDecodeRatio cannot be kept.
METRIC_OPERATOR_AUTOSCALE_REPLICAS: Final = "pdwarden_operator_autoscale_replicas"
METRIC_OPERATOR_AUTOSCALE_RECOMMENDED: Final = "pdwarden_operator_autoscale_recommended_replicas"
METRIC_OPERATOR_AUTOSCALE_SATURATED: Final = "pdwarden_operator_autoscale_saturated"
METRIC_OPERATOR_AUTOSCALE_DECISIONS_TOTAL: Final = "pdwarden_operator_autoscale_decisions_total"
METRIC_OPERATOR_RATIO_UNKEEPABLE: Final = "pdwarden_operator_autoscale_ratio_unkeepable"
OPERATOR_METRICS_PORT: Final = 8080
OPERATOR_HEALTH_PORT: Final = 8081
