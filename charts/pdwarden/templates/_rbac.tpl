{{/*
The operator's permissions, least privilege: what it reconciles and remediates, and
nothing else. No access to Secrets (the operator never reads or writes one).
*/}}
{{- define "pdwarden.operatorRules" -}}
# DisaggregatedModels: watch, and kopf's progress annotations / finalizers.
- apiGroups: ["pdwarden.io"]
  resources: ["disaggregatedmodels"]
  verbs: ["get", "list", "watch", "patch", "update"]
# Children carry blockOwnerDeletion: with OwnerReferencesPermissionEnforcement the API server
# requires update on the owner's finalizers subresource to set it.
- apiGroups: ["pdwarden.io"]
  resources: ["disaggregatedmodels/finalizers"]
  verbs: ["update"]
# Status is written in one place by the operator.
- apiGroups: ["pdwarden.io"]
  resources: ["disaggregatedmodels/status"]
  verbs: ["get", "patch", "update"]
# Children (server-side apply, watched for drift): prefill/decode/router Deployments, the
# router's Service, its ServiceAccount and the Role(Binding) that lets it discover pods,
# and a PodDisruptionBudget per role.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# The router's Role only grants pods get/list/watch, which the operator holds itself
# (RBAC forbids granting more than one has), so no `bind` or `escalate` is needed.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Watchdog: find runtime pods (their IPs to scrape) and remediate a wedged one.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
# Every decision is an Event.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
