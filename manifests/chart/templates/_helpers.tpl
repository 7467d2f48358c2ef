{{/* The name of every object: the release name when it names the chart, else prefixed. */}}
{{- define "gpu-admission.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* What selects the webhook's Pods: the same as the kustomize manifests, no release label,
so a selector never changes on an upgrade (Deployment selectors are immutable). */}}
{{- define "gpu-admission.selectorLabels" -}}
app.kubernetes.io/name: gpu-admission
app.kubernetes.io/component: webhook
{{- end -}}

{{/* Labels of every object: part-of, as kustomize adds it, and Helm's own. */}}
{{- define "gpu-admission.labels" -}}
app.kubernetes.io/part-of: gpu-admission
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpu-admission.tlsSecret" -}}
{{- .Values.certificates.secretName | default (printf "%s-tls" (include "gpu-admission.fullname" .)) -}}
{{- end -}}

{{- define "gpu-admission.policyConfigMap" -}}
{{- .Values.policy.existingConfigMap | default (printf "%s-policy" (include "gpu-admission.fullname" .)) -}}
{{- end -}}

{{- define "gpu-admission.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The validating webhook's failure policy once activated: audit-only installs fail open. */}}
{{- define "gpu-admission.failurePolicy" -}}
{{- if .Values.auditOnly -}}Ignore{{- else -}}{{ .Values.webhooks.validating.failurePolicy }}{{- end -}}
{{- end -}}

{{- define "gpu-admission.customResourcesFailurePolicy" -}}
{{- if .Values.auditOnly -}}Ignore{{- else -}}{{ .Values.webhooks.customResources.failurePolicy }}{{- end -}}
{{- end -}}

{{/* The namespaces never sent to the webhooks. */}}
{{- define "gpu-admission.namespaceSelector" -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values:
      {{- $provider := list -}}
      {{- if eq .Values.certificates.source "certManager" }}{{ $provider = compact (list .Values.webhooks.certificateProviderNamespace) }}{{ end }}
      {{- toYaml (concat (list "kube-system" .Release.Namespace) $provider (.Values.webhooks.extraExcludedNamespaces | default list)) | nindent 6 }}
  - key: gpu-admission.io/ignore
    operator: DoesNotExist
{{- end -}}

{{/* The pod and container security settings of every Pod of the chart. */}}
{{- define "gpu-admission.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpu-admission.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The custom kinds an inline policy adds (spec.workloads), as webhook rules: one per kind,
every version. An existing ConfigMap cannot be read at render time; its kinds go in
webhooks.customResources.extraRules. */}}
{{- define "gpu-admission.policyWorkloadRules" -}}
{{- $rules := list -}}
{{- if .Values.policy.inline -}}
{{- range ((.Values.policy.inline | fromYaml).spec | default dict).workloads | default list -}}
{{- if not (has .group (list "" "apps" "batch" "extensions")) -}}
{{- $resource := .resource | default (printf "%ss" (lower .kind)) -}}
{{- $rules = append $rules (dict "apiGroups" (list .group) "apiVersions" (list "*") "operations" (list "CREATE" "UPDATE") "resources" (list $resource) "scope" "*") -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $rules = concat $rules (.Values.webhooks.customResources.extraRules | default list) -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* The rules of an inline policy's own kinds with pod templates, on CREATE, for the mutating
webhook's entry for workloads (the GPU defaults go in templates only), and the extra ones. */}}
{{- define "gpu-admission.policyWorkloadMutatingRules" -}}
{{- $rules := list -}}
{{- if .Values.policy.inline -}}
{{- range ((.Values.policy.inline | fromYaml).spec | default dict).workloads | default list -}}
{{- if and .templates (not (has .group (list "" "apps" "batch" "extensions"))) -}}
{{- $resource := .resource | default (printf "%ss" (lower .kind)) -}}
{{- $rules = append $rules (dict "apiGroups" (list .group) "apiVersions" (list "*") "operations" (list "CREATE") "resources" (list $resource) "scope" "*") -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $rules = concat $rules (.Values.webhooks.mutating.extraWorkloadRules | default list) -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* The same kinds as read rules, for the auditor and background-audit roles. */}}
{{- define "gpu-admission.policyWorkloadReadRules" -}}
{{- $rules := list -}}
{{- range (include "gpu-admission.policyWorkloadRules" . | fromYamlArray) -}}
{{- $rules = append $rules (dict "apiGroups" .apiGroups "resources" .resources "verbs" (list "get" "list")) -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* The policy's text, as the policy ConfigMap and the pre-install check both carry it. */}}
{{- define "gpu-admission.policyText" -}}
{{- if .Values.policy.inline }}
{{- .Values.policy.inline }}
{{- else if .Values.auditOnly }}
{{- .Files.Get "files/audit-policy.yaml" }}
{{- else }}
{{- .Files.Get "files/policy.yaml" }}
{{- end }}
{{- end }}
