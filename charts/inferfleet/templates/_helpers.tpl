{{/*
The operator's name: the release name when it already says inferfleet (so a release named
inferfleet gives inferfleet-operator, the name deploy/rbac/ uses), else <release>-inferfleet,
with -operator appended. Cut to 63 characters, the limit of a label value and a DNS label.
*/}}
{{- define "inferfleet.operatorName" -}}
{{- $base := .Release.Name -}}
{{- if not (contains .Chart.Name .Release.Name) -}}
{{- $base = printf "%s-%s" .Release.Name .Chart.Name -}}
{{- end -}}
{{- printf "%s-operator" ($base | trunc 54 | trimSuffix "-") -}}
{{- end -}}

{{- define "inferfleet.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "inferfleet.operatorName" .) -}}
{{- end -}}

{{/* What selects the operator's pods; never changes over an upgrade (selectors are immutable). */}}
{{- define "inferfleet.selectorLabels" -}}
app.kubernetes.io/name: inferfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inferfleet.labels" -}}
{{ include "inferfleet.selectorLabels" . }}
app.kubernetes.io/part-of: inferfleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* An image reference from image.registry, a repository and image.tag (default appVersion). */}}
{{- define "inferfleet.image" -}}
{{- $root := index . 0 -}}
{{- $repository := index . 1 -}}
{{- $tag := $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- with $root.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" .) $repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The operator's rules, generated from operator/inferfleet/render/rbac.py. */}}
{{- define "inferfleet.rules" -}}
{{- $rules := .Files.Get "files/operator-rules.yaml" | fromYaml -}}
{{- if not $rules.namespaced -}}
{{- fail "files/operator-rules.yaml is missing or empty" -}}
{{- end -}}
{{- toYaml $rules -}}
{{- end -}}

{{/* Where the operator's health and metrics ports listen: operator.listenAddress, or the pod's
IP (from the POD_IP variable the Deployment sets). */}}
{{- define "inferfleet.listenAddress" -}}
{{- .Values.operator.listenAddress | default "$(POD_IP)" -}}
{{- end -}}

{{/* The same as a URL's host: an IPv6 address in brackets. */}}
{{- define "inferfleet.listenHost" -}}
{{- $address := include "inferfleet.listenAddress" . -}}
{{- if contains ":" $address -}}
{{- printf "[%s]" $address -}}
{{- else -}}
{{- $address -}}
{{- end -}}
{{- end -}}
