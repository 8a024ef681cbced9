{{- define "scoring-worker.name" -}}{{ .Release.Name }}-scoring-worker{{- end -}}
{{- define "scoring-worker.labels" -}}
app.kubernetes.io/name: scoring-worker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* The worker's config from the chart's own values (the keys the deployment decides:
brokers, security files, topics, model path, ports), before the config value is added. */ -}}
{{- define "scoring-worker.streamBase" -}}
source:
  type: kafka
  topic: {{ .Values.topics.input | quote }}
  {{- if .Values.avroSchemas }}
  schemas_dir: /etc/scoring-worker
  {{- end }}
sink:
  type: kafka
  topic: {{ .Values.topics.scores | quote }}
  dead_letter_topic: {{ .Values.topics.deadLetters | quote }}
  shadow_topic: {{ .Values.topics.shadow | quote }}
kafka:
  bootstrap_servers: {{ .Values.kafka.bootstrapServers | quote }}
  group_id: {{ .Values.kafka.groupId | quote }}
  {{- with .Values.kafka }}
  security_protocol: {{ .securityProtocol }}
  {{- if hasPrefix "SASL" .securityProtocol }}
  sasl_mechanism: {{ .saslMechanism }}
  sasl_password_file: /etc/kafka-credentials/password
  {{- end }}
  {{- if and .caSecret (ne .securityProtocol "PLAINTEXT") }}
  ssl_ca_location: /etc/kafka-ca/ca.crt
  {{- end }}
  {{- if .tlsSecret }}
  ssl_certificate_location: /etc/kafka-tls/tls.crt
  ssl_key_location: /etc/kafka-tls/tls.key
  {{- end }}
  {{- end }}
model:
  path: {{ printf "%s/%s" .Values.model.mountPath .Values.model.file | quote }}
  {{- if .Values.model.shadowFile }}
  shadow_path: {{ printf "%s/%s" .Values.model.mountPath .Values.model.shadowFile | quote }}
  {{- end }}
  reload: {{ .Values.model.reload }}
  reload_interval_ms: {{ .Values.model.reloadIntervalMs }}
scoring:
  id_column: {{ .Values.scoring.idColumn | quote }}
  thresholds: {{ toJson .Values.scoring.thresholds }}
  threads: {{ .Values.scoring.threads }}
  lazy: {{ include "scoring-worker.lazy" . }}
delivery:
  mode: {{ .Values.delivery.mode }}
  stop_timeout_ms: {{ .Values.delivery.stopTimeoutMs }}
  memory_budget_mb: {{ .Values.delivery.memoryBudgetMb }}
metrics: {port: {{ .Values.metricsPort }}}
logging: {format: json, progress: false}
{{- end -}}

{{- define "scoring-worker.serveBase" -}}
model:
  path: {{ printf "%s/%s" .Values.model.mountPath .Values.model.file | quote }}
  reload: {{ .Values.model.reload }}
  reload_interval_ms: {{ .Values.model.reloadIntervalMs }}
scoring:
  id_column: {{ .Values.scoring.idColumn | quote }}
  thresholds: {{ toJson .Values.scoring.thresholds }}
  threads: {{ .Values.scoring.threads }}
  lazy: {{ include "scoring-worker.lazy" . }}
serve:
  host: 0.0.0.0
  port: {{ .Values.serve.port }}
  name: {{ .Values.serve.modelName | quote }}
  workers: {{ .Values.serve.workers }}
  max_body_bytes: {{ int64 .Values.serve.maxBodyBytes }}
  max_rows: {{ int64 .Values.serve.maxRows }}
  max_explain_rows: {{ int64 .Values.serve.maxExplainRows }}
  max_response_bytes: {{ int64 .Values.serve.maxResponseBytes }}
  {{- if not (kindIs "invalid" .Values.serve.grpcPort) }}
  grpc_port: {{ .Values.serve.grpcPort }}
  grpc_max_message_bytes: {{ int64 .Values.serve.grpcMaxMessageBytes }}
  {{- end }}
  max_connections: {{ .Values.serve.maxConnections }}
  request_timeout_ms: {{ .Values.serve.requestTimeoutMs }}
  keepalive_timeout_ms: {{ .Values.serve.keepaliveTimeoutMs }}
logging: {format: json, progress: false}
{{- end -}}

{{- /* scoring.lazy: a mode (quoted: YAML reads an unquoted off as false, taken as off), or
the lazy section itself, its mode and its policy's parameters */ -}}
{{- define "scoring-worker.lazy" -}}
{{- $lazy := .Values.scoring.lazy -}}
{{- if kindIs "map" $lazy -}}{{ toJson $lazy }}
{{- else if eq (toString $lazy) "false" -}}{mode: "off"}
{{- else -}}{mode: {{ $lazy | quote }}}{{- end -}}
{{- end -}}

{{- /* Keys the pod sets another way (its environment, its Secrets): refused in config, with
why. A secret written in config would sit in a ConfigMap; a key the environment also sets
would be silently overridden by it. */ -}}
{{- define "scoring-worker.refused" -}}
kafka.transactional_id: "is set per pod from kafka.groupId (<group id>-<pod name>): one fixed id would fence every pod but one"
kafka.sasl_username: "comes from kafka.credentialsSecret (its key username), through the pod's environment"
kafka.sasl_password: "is a secret, never in a ConfigMap: kafka.credentialsSecret mounts it as a file"
kafka.ssl_key_password: "is a secret, never in a ConfigMap: kafka.tlsSecret (its key key-password) provides it"
kafka.sasl_oauthbearer_client_secret: "is a secret, never in a ConfigMap: mount it from a Secret and set kafka.sasl_oauthbearer_client_secret_file"
kafka.allow_secrets_in_file: "would let a secret into the ConfigMap: secrets come from Secrets, as files"
metrics.host: "is the pod's IP, through the pod's environment"
{{- end -}}

{{- /* Which chart value sets each key of the base config (named when config sets one). */ -}}
{{- define "scoring-worker.owners" -}}
source.type: "from its value topics.input: set that instead"
source.topic: "from its value topics.input: set that instead"
source.schemas_dir: "from its value avroSchemas: set that instead"
sink.type: "from its value topics.scores: set that instead"
sink.topic: "from its value topics.scores: set that instead"
sink.dead_letter_topic: "from its value topics.deadLetters: set that instead"
sink.shadow_topic: "from its value topics.shadow: set that instead"
kafka.bootstrap_servers: "from its value kafka.bootstrapServers: set that instead"
kafka.group_id: "from its value kafka.groupId: set that instead"
kafka.security_protocol: "from its value kafka.securityProtocol: set that instead"
kafka.sasl_mechanism: "from its value kafka.saslMechanism: set that instead"
kafka.sasl_password_file: "from its value kafka.credentialsSecret: set that instead"
kafka.ssl_ca_location: "from its value kafka.caSecret: set that instead"
kafka.ssl_certificate_location: "from its value kafka.tlsSecret: set that instead"
kafka.ssl_key_location: "from its value kafka.tlsSecret: set that instead"
model.path: "from its value model.mountPath and model.file: set that instead"
model.shadow_path: "from its value model.shadowFile: set that instead"
model.reload: "from its value model.reload: set that instead"
model.reload_interval_ms: "from its value model.reloadIntervalMs: set that instead"
scoring.id_column: "from its value scoring.idColumn: set that instead"
scoring.thresholds: "from its value scoring.thresholds: set that instead"
scoring.threads: "from its value scoring.threads: set that instead"
scoring.lazy: "from its value scoring.lazy: set that instead"
delivery.mode: "from its value delivery.mode: set that instead"
delivery.stop_timeout_ms: "from its value delivery.stopTimeoutMs: set that instead"
delivery.memory_budget_mb: "from its value delivery.memoryBudgetMb: set that instead"
metrics.port: "from its value metricsPort: set that instead"
serve.host: "(it listens on every address in the pod)"
serve.port: "from its value serve.port: set that instead"
serve.name: "from its value serve.modelName: set that instead"
serve.workers: "from its value serve.workers: set that instead"
serve.max_body_bytes: "from its value serve.maxBodyBytes: set that instead"
serve.max_rows: "from its value serve.maxRows: set that instead"
serve.max_explain_rows: "from its value serve.maxExplainRows: set that instead"
serve.max_response_bytes: "from its value serve.maxResponseBytes: set that instead"
serve.grpc_port: "from its value serve.grpcPort: set that instead"
serve.grpc_max_message_bytes: "from its value serve.grpcMaxMessageBytes: set that instead"
serve.max_connections: "from its value serve.maxConnections: set that instead"
serve.request_timeout_ms: "from its value serve.requestTimeoutMs: set that instead"
serve.keepalive_timeout_ms: "from its value serve.keepaliveTimeoutMs: set that instead"
logging.format: "(json, one object a line, for the cluster's log collector)"
logging.progress: "(off, no terminal)"
{{- end -}}

{{- /* The worker's config: the base from the chart's values with every key of the config
value added. A key the base has is refused (naming the chart value that sets it): a value
silently overridden, or silently ignored, would be a deployment that is not what it says. */ -}}
{{- define "scoring-worker.config" -}}
{{- $base := include (ternary "scoring-worker.serveBase" "scoring-worker.streamBase" (eq .Values.mode "serve")) . | fromYaml -}}
{{- $owners := include "scoring-worker.owners" . | fromYaml -}}
{{- $refused := include "scoring-worker.refused" . | fromYaml -}}
{{- range $section, $keys := .Values.config -}}
{{- if not (kindIs "map" $keys) -}}
{{- fail (printf "config.%s: a section of the worker's config is a mapping of its keys" $section) -}}
{{- end -}}
{{- $into := dict -}}
{{- if hasKey $base $section -}}{{- $into = get $base $section -}}{{- end -}}
{{- range $key, $value := $keys -}}
{{- $path := printf "%s.%s" $section $key -}}
{{- if hasKey $refused $path -}}
{{- fail (printf "config.%s: %s" $path (get $refused $path)) -}}
{{- end -}}
{{- if or (hasKey $into $key) (hasKey $owners $path) -}}
{{- fail (printf "config.%s.%s: the chart sets this key %s" $section $key (get $owners $path | default "from its values (values.yaml)")) -}}
{{- end -}}
{{- $_ := set $into $key $value -}}
{{- end -}}
{{- $_ := set $base $section $into -}}
{{- end -}}
{{- toYaml $base -}}
{{- end -}}
