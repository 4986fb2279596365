{{/* Labels on every object: the same as manifests/. */}}
{{- define "tfe.labels" -}}
app.kubernetes.io/part-of: tensor-fusion-extender
{{- end }}

{{- define "tfe.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* kube-scheduler's image: scheduler.image.tag, else the cluster's own vMAJOR.MINOR.PATCH (the version-skew
policy forbids a scheduler newer than the API server; a vendor suffix such as -eks-1a2b is dropped). */}}
{{- define "tfe.schedulerImage" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ .Values.scheduler.image.repository }}:{{ .Values.scheduler.image.tag | default (printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch) }}
{{- end }}

{{/* Command-line flags from (name value default) triples: nothing when the value is the program's default
(so the default values render the command lines of manifests/), --name / --no-name for a switch, else
--name=value. An empty string means the program's own default. */}}
{{- define "tfe.flags" -}}
{{- $out := list -}}
{{- range . -}}
{{- $name := index . 0 -}}{{- $value := index . 1 -}}{{- $default := index . 2 -}}
{{- if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) -}}
{{- $value = int64 $value -}}{{/* values files give whole numbers as floats: 1000000, not 1e+06 */}}
{{- end -}}
{{- if and (ne (toString $value) (toString $default)) (ne (toString $value) "") -}}
{{- if kindIs "bool" $value -}}
{{- $out = append $out (printf "--%s%s" (ternary "" "no-" $value) $name) -}}
{{- else -}}
{{- $out = append $out (printf "--%s=%v" $name $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $out }}{{ toYaml $out }}{{ end -}}
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

{{/* "true" unless an object of this name exists that this release does not manage (TensorFusion's chart's,
or one made by hand): the default objects never clash with those, and are left to their owner.
Arguments: root, apiVersion, kind, name (cluster scoped). Without a cluster (helm template) nothing exists;
under gitops.enabled nothing is looked up. */}}
{{- define "tfe.ownable" -}}
{{- $root := index . 0 -}}
{{- $found := dict -}}
{{- if include "tfe.lookups" $root -}}
{{- $found = lookup (index . 1) (index . 2) "" (index . 3) -}}
{{- end -}}
{{- if not $found -}}true
{{- else if and (eq (dig "metadata" "annotations" "meta.helm.sh/release-name" "" $found) $root.Release.Name) (eq (dig "metadata" "annotations" "meta.helm.sh/release-namespace" "" $found) $root.Release.Namespace) -}}true
{{- end -}}
{{- end }}

{{/* false when the chart is rendered where lookup cannot see the cluster (gitops.enabled: Argo CD, helm
template | kubectl apply): then no object is left out because of what a lookup found. */}}
{{- define "tfe.lookups" -}}
{{- if not .Values.gitops.enabled }}true{{ end -}}
{{- end }}

{{/* "true" when TensorFusion's default objects are rendered at all: always with Helm's lookups (each is then
left out where another owner has it), under gitops.enabled only with gitops.defaultObjects. */}}
{{- define "tfe.defaultObjects" -}}
{{- if or (not .Values.gitops.enabled) .Values.gitops.defaultObjects }}true{{ end -}}
{{- end }}

{{/* The pod-level overrides shared by the scheduler's and the webhook's Deployments: annotations and labels
of the pod template (metadata), then the pod spec's priority class, affinity, spread, security context and
extra volumes. Arguments: root, the component's values, its app.kubernetes.io/name, pod annotations. */}}
{{- define "tfe.podMetadata" -}}
{{- $root := index . 0 -}}{{- $v := index . 1 -}}{{- $name := index . 2 -}}{{- $annotations := index . 3 -}}
{{- $annotations = merge (dict) $annotations ($v.podAnnotations | default dict) -}}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
labels:
  {{- with $v.podLabels }}
  {{- toYaml (omit . "app.kubernetes.io/name" "app.kubernetes.io/part-of") | nindent 2 }}
  {{- end }}
  app.kubernetes.io/name: {{ $name }}
  {{- include "tfe.labels" $root | nindent 2 }}
{{- end }}

{{- define "tfe.podSpec" -}}
{{- $root := index . 0 -}}{{- $v := index . 1 -}}{{- $name := index . 2 -}}
{{- with $v.priorityClassName | default $root.Values.priorityClass.name }}
priorityClassName: {{ . }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "tfe.over" (list (dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "seccompProfile" (dict "type" "RuntimeDefault")) $v.podSecurityContext) | nindent 2 }}
affinity:
  {{- if $v.affinity }}
  {{- toYaml $v.affinity | nindent 2 }}
  {{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            app.kubernetes.io/name: {{ $name }}
  {{- end }}
{{- with $v.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A container's securityContext: the defaults (no privilege escalation, read-only root, no capabilities)
with the given values over them. */}}
{{- define "tfe.containerSecurityContext" -}}
{{- include "tfe.over" (list (dict "allowPrivilegeEscalation" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL"))) .) }}
{{- end }}

{{/* (defaults, given) as YAML: each key of given replaces the default's, false included (sprig's merge
would keep a default true over a given false). */}}
{{- define "tfe.over" -}}
{{- $out := deepCopy (index . 0) -}}
{{- range $k, $v := (index . 1 | default dict) }}{{ $_ := set $out $k $v }}{{ end -}}
{{- toYaml $out }}
{{- end }}
