{{/* Labels of a component's objects: kpx.labels "controlplane" */}}
{{- define "kpx.labels" -}}
app.kubernetes.io/name: kpx
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- define "kpx.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

{{/* Where node agents dial the control plane. */}}
{{- define "kpx.controlPlaneURL" -}}
{{- if .Values.controlPlane.url -}}
{{ .Values.controlPlane.url }}
{{- else -}}
https://kpx-controlplane.{{ .Release.Namespace }}.svc:18000
{{- end -}}
{{- end -}}

{{/* The API server's real address as "HOST PORT" (empty when unknown): apiServer.host and
     apiServer.port, else — on helm install or upgrade against a cluster — the first
     endpoint of the `kubernetes` Service's EndpointSlice (what the cluster says now; under
     helm template nothing is looked up). */}}
{{- define "kpx.apiServerHostPort" -}}
{{- if .Values.apiServer.host -}}
{{ .Values.apiServer.host }} {{ .Values.apiServer.port | default "6443" }}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if and $slice $slice.endpoints $slice.ports -}}
{{ index (first $slice.endpoints).addresses 0 }} {{ (first $slice.ports).port }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The API server's real address as a URL, for the node agents (empty when unknown). */}}
{{- define "kpx.apiServerURL" -}}
{{- $hp := splitList " " (include "kpx.apiServerHostPort" .) -}}
{{- if eq (len $hp) 2 -}}
{{- $host := index $hp 0 -}}
https://{{ if contains ":" $host }}[{{ $host }}]{{ else }}{{ $host }}{{ end }}:{{ index $hp 1 }}
{{- end -}}
{{- end -}}
