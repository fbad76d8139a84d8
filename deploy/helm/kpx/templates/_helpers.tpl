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

{{/* Whether the agents take kube-proxy's ports: on helm install or upgrade against a
     cluster (its release namespace can be looked up) that runs no DaemonSet
     kube-system/kube-proxy. Under helm template nothing is looked up: "" (beside it). */}}
{{- define "kpx.kubeProxyGone" -}}
{{- if and (lookup "v1" "Namespace" "" .Release.Namespace) (not (lookup "apps/v1" "DaemonSet" "kube-system" "kube-proxy")) -}}
true
{{- end -}}
{{- end -}}

{{/* The agent's healthz port: dataplane.ports.healthz, else 10256 where no kube-proxy
     runs, else 10356. */}}
{{- define "kpx.healthzPort" -}}
{{- .Values.dataplane.ports.healthz | default (eq (include "kpx.kubeProxyGone" .) "true" | ternary 10256 10356) -}}
{{- end -}}

{{/* The agent's metrics port (/metrics, /proxyMode): dataplane.ports.metrics, else 10249
     where no kube-proxy runs, else 10349. */}}
{{- define "kpx.metricsPort" -}}
{{- .Values.dataplane.ports.metrics | default (eq (include "kpx.kubeProxyGone" .) "true" | ternary 10249 10349) -}}
{{- end -}}
