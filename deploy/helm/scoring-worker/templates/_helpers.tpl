{{- define "scoring-worker.name" -}}{{ .Release.Name }}-scoring-worker{{- end -}}
{{- define "scoring-worker.labels" -}}
app.kubernetes.io/name: scoring-worker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
