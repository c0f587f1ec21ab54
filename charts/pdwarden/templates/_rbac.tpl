{{/*
The operator's permissions, least privilege: what it reconciles and remediates, and
nothing else. Secrets: create only (each model's worker key); the operator can never read,
list, change or delete a Secret.

What this grants, said plainly: whoever controls the operator (its ServiceAccount token,
its image, or a DisaggregatedModel it reconciles) can create Deployments, and a Deployment
runs pods as any ServiceAccount of its namespace and with any podTemplate the API server's
admission allows. With operator.scope=cluster (a ClusterRole) that is every namespace: the
operator is as powerful as "create pods anywhere", which includes using every namespace's
ServiceAccounts and their permissions. On a multi-tenant cluster use operator.scope=namespace
(a Role in one namespace, nothing cluster-wide), one operator per tenant namespace, and
enforce a Pod Security level on those namespaces (pdwarden's pods pass `restricted` unless
they use hostPath, hostNetwork or RDMA).

RBAC names resources, not objects: the admission policy operator-writes
(templates/admission-policies.yaml, admissionPolicies.confineOperator) refuses the operator's
writes to any object that is not a model's, in both scopes.
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
# a PodDisruptionBudget per role; for multi-node replicas a StatefulSet per group and a
# headless Service per role.
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Autoscaling: an autoscaled role's count, set through its Deployment's scale subresource
# (a pod's deletion cost, which says which pod a scale-in removes, is a pods patch below).
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "patch"]
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
# The NetworkPolicies of a model's runtime and router pods (networkPolicy.enabled, the
# default), deleted again when disabled.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# Watchdog: find runtime pods (their IPs to scrape) and remediate a wedged one (patch:
# action drain quarantines it by its labels and owner reference; each pod of a multi-node
# replica is labelled with its rank).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods/eviction"]
  verbs: ["create"]
# The watchdog acts only on pods its model controls: a pod's ReplicaSet is read once to
# follow its controller up to the model's Deployment.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["get"]
# The watchdog's list of each model's gone runtime pods (a ConfigMap `<model>-gone-pods` its
# runtime pods mount): decodes free pages held for a writer once its pod is listed there.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
# Each model's worker key, a Secret with a generated name that the model owns (the garbage
# collector deletes it with the model). Create only: the operator never reads a Secret, and
# learns which one a model uses from the model's own workloads.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Every decision is an Event.
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
