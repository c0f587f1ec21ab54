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

{{- define "pdwarden.labels" -}}
helm.sh/chart: {{ include "pdwarden.chart" . }}
{{ include "pdwarden.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdwarden
{{- end }}

{{- define "pdwarden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdwarden.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "pdwarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pdwarden.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pdwarden.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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
