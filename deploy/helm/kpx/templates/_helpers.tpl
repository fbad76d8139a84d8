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
