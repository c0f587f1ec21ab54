{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "pdwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or just the release name when it already contains the chart name. */}}
{{- define "pdwarden.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pdwarden.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels of the release's objects, the operator's: every object but the helm test's. */}}
{{- define "pdwarden.labels" -}}
{{ include "pdwarden.commonLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* What every object of the release carries whatever its component. */}}
{{- define "pdwarden.commonLabels" -}}
helm.sh/chart: {{ include "pdwarden.chart" . }}
{{ include "pdwarden.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdwarden
{{- end }}

{{- define "pdwarden.instanceLabels" -}}
app.kubernetes.io/name: {{ include "pdwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The operator's pods: the Deployment's selector, and the Service's, the
PodDisruptionBudget's and the NetworkPolicy's. */}}
{{- define "pdwarden.selectorLabels" -}}
{{ include "pdwarden.instanceLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The `helm test` Pod (templates/tests/): never the operator's component, so that nothing
selecting the operator's pods selects it. */}}
{{- define "pdwarden.testSelectorLabels" -}}
{{ include "pdwarden.instanceLabels" . }}
app.kubernetes.io/component: test
{{- end }}

{{- define "pdwarden.testLabels" -}}
{{ include "pdwarden.commonLabels" . }}
app.kubernetes.io/component: test
{{- end }}

{{/* The pre-upgrade hook that applies the CRD (templates/crd-upgrade.yaml). */}}
{{- define "pdwarden.crdUpgradeLabels" -}}
{{ include "pdwarden.commonLabels" . }}
app.kubernetes.io/component: crd-upgrade
{{- end }}

{{/* The hook annotations of its objects; the argument is the hook weight (RBAC before the Job). */}}
{{- define "pdwarden.crdUpgradeHook" -}}
helm.sh/hook: pre-upgrade
helm.sh/hook-weight: {{ . | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

{{- define "pdwarden.testName" -}}
{{- printf "%s-test" (include "pdwarden.fullname" .) }}
{{- end }}

{{- define "pdwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdwarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's image (the Deployment's and the helm test's): by digest when image.digest
is set (repository@sha256:..., the tag then ignored: the digest alone says what runs), else
by tag. */}}
{{- define "pdwarden.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespace the operator watches in namespace mode. */}}
{{- define "pdwarden.watchNamespace" -}}
{{- default .Release.Namespace .Values.operator.watchNamespace }}
{{- end }}

{{- define "pdwarden.metricsServiceName" -}}
{{- printf "%s-metrics" (include "pdwarden.fullname" .) }}
{{- end }}

{{/* Selects the runtime (prefill/decode) pods the operator creates. */}}
{{- define "pdwarden.runtimePodSelector" -}}
matchLabels:
  app.kubernetes.io/managed-by: pdwarden
matchExpressions:
  - key: pdwarden.io/role
    operator: In
    values: [prefill, decode]
{{- end }}

{{/* The user the API server sees when the operator calls it: its ServiceAccount. */}}
{{- define "pdwarden.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "pdwarden.serviceAccountName" .) }}
{{- end }}

{{/* A cluster-scoped name of the release's: with the release namespace in it, since the
namespace scope runs one release per tenant namespace, often all of the same name. The
argument is (list $ "suffix"). */}}
{{- define "pdwarden.clusterObjectName" -}}
{{- $ := index . 0 }}
{{- printf "%s.%s.%s" $.Release.Namespace (include "pdwarden.fullname" $) (index . 1) }}
{{- end }}
