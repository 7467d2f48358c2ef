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

{{/* The webhook's Pods' labels: podLabels, and the selector labels, which no value changes. */}}
{{- define "gpu-admission.podLabels" -}}
{{- $selector := include "gpu-admission.selectorLabels" . | fromYaml -}}
{{- range $key, $value := .Values.podLabels | default dict -}}
{{- if and (hasKey $selector $key) (ne (toString $value) (get $selector $key)) -}}
{{- fail (printf "podLabels: %s selects the webhook's Pods (Deployment, Service, PodDisruptionBudget, NetworkPolicy) and stays %s; give your label another key" $key (get $selector $key)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (merge (dict) $selector (.Values.podLabels | default dict)) -}}
{{- end -}}

{{/* The webhook's Pods' affinity: the chart's (one replica per node, preferred), each key of
the affinity value replacing the chart's key of that name. */}}
{{- define "gpu-admission.affinity" -}}
{{- $affinity := dict "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" (dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "gpu-admission.selectorLabels" . | fromYaml)))))) -}}
{{- range $key, $value := .Values.affinity | default dict -}}
{{- $_ := set $affinity $key $value -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{/* The webhook's Pods' spread: the chart's across zones, unless a constraint of the value
is on the zone too, then the value's constraints; a constraint without a labelSelector
counts the webhook's Pods. */}}
{{- define "gpu-admission.topologySpreadConstraints" -}}
{{- $selector := include "gpu-admission.selectorLabels" . | fromYaml -}}
{{- $zone := "topology.kubernetes.io/zone" -}}
{{- $constraints := list (dict "maxSkew" 1 "topologyKey" $zone "whenUnsatisfiable" "ScheduleAnyway" "labelSelector" (dict "matchLabels" $selector) "matchLabelKeys" (list "pod-template-hash")) -}}
{{- range .Values.topologySpreadConstraints | default list -}}
{{- if eq .topologyKey $zone -}}
{{- $constraints = list -}}
{{- end -}}
{{- end -}}
{{- range .Values.topologySpreadConstraints | default list -}}
{{- $constraint := deepCopy . -}}
{{- if not (hasKey $constraint "labelSelector") -}}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) -}}
{{- end -}}
{{- $constraints = append $constraints $constraint -}}
{{- end -}}
{{- toYaml $constraints -}}
{{- end -}}

{{/* The fewest replicas the webhook runs: the autoscaler's minimum, or the fixed count. */}}
{{- define "gpu-admission.minimumReplicas" -}}
{{- if .Values.autoscaling.enabled -}}{{ .Values.autoscaling.minReplicas }}{{- else -}}{{ .Values.replicaCount }}{{- end -}}
{{- end -}}

{{/* The inline policy, parsed. Text that is not a YAML mapping holding a GPUAdmissionPolicy
fails the render: Helm would otherwise install it, and only the server would refuse it. */}}
{{- define "gpu-admission.inlinePolicy" -}}
{{- $policy := .Values.policy.inline | fromYaml -}}
{{- $help := "give the policy's own text (apiVersion: gpu-admission.io/v1alpha1, kind: GPUAdmissionPolicy, metadata, spec), e.g. --set-file policy.inline=policy.yaml, and check it first with `gpu-admission policy validate policy.yaml`" -}}
{{- if and (hasKey $policy "Error") (contains "cannot unmarshal" $policy.Error) -}}
{{- fail (printf "policy.inline is YAML but not a mapping (a list or a single value); %s" $help) -}}
{{- else if hasKey $policy "Error" -}}
{{- fail (printf "policy.inline is not valid YAML (%s); %s" $policy.Error $help) -}}
{{- end -}}
{{- if ne (toString $policy.kind) "GPUAdmissionPolicy" -}}
{{- fail (printf "policy.inline is not a GPUAdmissionPolicy (kind: %s); %s" (toString ($policy.kind | default "none")) $help) -}}
{{- end -}}
{{- toYaml $policy -}}
{{- end -}}

{{/* The custom kinds an inline policy adds (spec.workloads), as webhook rules: one per kind,
every version. An existing ConfigMap cannot be read at render time; its kinds go in
webhooks.customResources.extraRules. */}}
{{- define "gpu-admission.policyWorkloadRules" -}}
{{- $rules := list -}}
{{- if .Values.policy.inline -}}
{{- range ((include "gpu-admission.inlinePolicy" . | fromYaml).spec | default dict).workloads | default list -}}
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
{{- range ((include "gpu-admission.inlinePolicy" . | fromYaml).spec | default dict).workloads | default list -}}
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
