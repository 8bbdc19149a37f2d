{{/*
The labels every object carries: kustomize's (app.kubernetes.io/name) and Helm's own.
*/}}
{{- define "node-agent.labels" -}}
app.kubernetes.io/name: node-agent
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "node-agent.serviceAccountName" -}}
{{- required "serviceAccount.name must name the agent's service account" .Values.serviceAccount.name -}}
{{- end }}

{{/*
The image: repository@digest, else repository:tag (the tag defaulting to appVersion).
*/}}
{{- define "node-agent.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The agent's config file: the value, else deploy/config.yaml as shipped.
*/}}
{{- define "node-agent.config" -}}
{{- if .Values.config -}}
{{ .Values.config }}
{{- else -}}
{{ .Files.Get "files/config.yaml" }}
{{- end -}}
{{- end }}

{{/*
A file that deploy/ ships, read through files/, with the agent's namespace and service account
made the release's. `file` names it; each text to replace must be in it, so a change in deploy/
that moves one fails the render instead of installing a half-renamed object.
*/}}
{{- define "node-agent.shipped" -}}
{{- $text := .root.Files.Get (printf "files/%s" .file) -}}
{{- if not $text -}}
{{- fail (printf "files/%s is missing from the chart" .file) -}}
{{- end -}}
{{- range $from, $to := .replace -}}
{{- if not (contains $from $text) -}}
{{- fail (printf "files/%s no longer holds %q" $.file $from) -}}
{{- end -}}
{{- $text = replace $from $to $text -}}
{{- end -}}
{{ $text }}
{{- end }}

{{/*
The runtime's CRI socket inside the DaemonSet's mount of the host's /run, and its root.
*/}}
{{- define "node-agent.runtime" -}}
{{- $all := dict
  "containerd" (dict "socket" "unix:///host/run/containerd/containerd.sock" "root" "/var/lib/containerd")
  "k3s" (dict "socket" "unix:///host/run/k3s/containerd/containerd.sock" "root" "/var/lib/rancher/k3s/agent/containerd")
  "rke2" (dict "socket" "unix:///host/run/k3s/containerd/containerd.sock" "root" "/var/lib/rancher/rke2/agent/containerd")
  "crio" (dict "socket" "unix:///host/run/crio/crio.sock" "root" "/var/lib/containers/storage") -}}
{{- $r := get $all .Values.runtime -}}
{{- if not $r -}}
{{- fail (printf "runtime %q is none of containerd, k3s, rke2, crio" .Values.runtime) -}}
{{- end -}}
{{- toJson $r -}}
{{- end }}
