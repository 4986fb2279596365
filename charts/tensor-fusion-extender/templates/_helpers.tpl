{{/* Labels on every object: the same as manifests/. */}}
{{- define "tfe.labels" -}}
app.kubernetes.io/part-of: tensor-fusion-extender
{{- end }}

{{- define "tfe.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* "true" when a switch that may be auto is on: auto follows whether the cluster serves the API. */}}
{{- define "tfe.auto" -}}
{{- $value := index . 0 -}}{{- $api := index . 1 -}}{{- $caps := index . 2 -}}
{{- if eq (toString $value) "auto" -}}
{{- if $caps.APIVersions.Has $api }}true{{ end -}}
{{- else if $value -}}true{{- end -}}
{{- end }}

{{- define "tfe.writeGpuStatus" -}}
{{- $value := .Values.extender.writeGpuStatus -}}
{{- if eq (toString $value) "auto" -}}
{{- if not (.Capabilities.APIVersions.Has "tensor-fusion.ai/v1/TensorFusionConnection") }}true{{ end -}}
{{- else if $value -}}true{{- end -}}
{{- end }}

{{/* The TLS mode in force: hook, secret or cert-manager. */}}
{{- define "tfe.tlsMode" -}}
{{- $mode := .Values.tls.mode -}}
{{- if eq $mode "auto" -}}
{{- if .Capabilities.APIVersions.Has "cert-manager.io/v1" }}cert-manager{{ else }}hook{{ end -}}
{{- else if has $mode (list "hook" "secret" "cert-manager") -}}
{{- $mode -}}
{{- else -}}
{{- fail (printf "tls.mode %q: use auto, hook, secret or cert-manager" $mode) -}}
{{- end -}}
{{- end }}

{{- define "tfe.webhookDNS" -}}
- tensor-fusion-webhook.{{ .Release.Namespace }}.svc
- tensor-fusion-webhook.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}
