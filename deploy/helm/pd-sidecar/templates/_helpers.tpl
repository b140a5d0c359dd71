{{/* Chart name. */}}
{{- define "pd-sidecar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-chart, unless overridden. */}}
{{- define "pd-sidecar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pd-sidecar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-sidecar.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pd-sidecar.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "pd-sidecar.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pd-sidecar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pd-sidecar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The flags in effect, as JSON: sidecar.flags with the keys of
     sidecar.configuration (the mounted configuration file) over them.
     Read it with: include "pd-sidecar.effectiveFlags" . | fromJson */}}
{{- define "pd-sidecar.effectiveFlags" -}}
{{- mergeOverwrite (deepCopy .Values.sidecar.flags) (deepCopy (default (dict) .Values.sidecar.configuration)) | toJson -}}
{{- end -}}

{{/* Where the configuration file from sidecar.configuration is mounted. */}}
{{- define "pd-sidecar.configurationDir" -}}/etc/pd-sidecar/configuration{{- end -}}

{{/* A flag's value ("" when unset). */}}
{{- define "pd-sidecar.flag" -}}
{{- $v := index .root.Values.sidecar.flags .name -}}
{{- if kindIs "invalid" $v -}}{{- else -}}{{- $v -}}{{- end -}}
{{- end -}}

{{/* The sidecar's command-line arguments, one per flag, in name order:
     booleans always, lists joined with commas, null and "" left out; the
     flags sidecar.configuration names are left to the configuration file
     (a flag on the command line would win over it). */}}
{{- define "pd-sidecar.args" -}}
{{- $cfg := default (dict) .Values.sidecar.configuration -}}
{{- if $cfg }}
{{- if or (index .Values.sidecar.flags "configuration") (index .Values.sidecar.flags "configuration-file") }}
{{- fail "sidecar.configuration cannot be combined with sidecar.flags.configuration or sidecar.flags.configuration-file" }}
{{- end }}
{{- range $name, $_ := $cfg }}
{{- if or (eq $name "configuration") (eq $name "configuration-file") }}
{{- fail (printf "sidecar.configuration.%s: a configuration cannot name another" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $v := .Values.sidecar.flags }}
{{- if hasKey $cfg $name }}
{{- else if kindIs "bool" $v }}
- {{ printf "--%s=%t" $name $v | quote }}
{{- else if kindIs "slice" $v }}
{{- if $v }}
- {{ printf "--%s=%s" $name (join "," $v) | quote }}
{{- end }}
{{- else if kindIs "invalid" $v }}
{{- else if ne (toString $v) "" }}
{{- if kindIs "float64" $v }}
- {{ printf "--%s=%d" $name (int64 $v) | quote }}
{{- else }}
- {{ printf "--%s=%v" $name $v | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if $cfg }}
- {{ printf "--configuration-file=%s/sidecar.yaml" (include "pd-sidecar.configurationDir" .) | quote }}
{{- end }}
{{- range .Values.sidecar.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The native sidecar: an init container that keeps running
     (restartPolicy: Always), started before and stopped after the engine. */}}
{{- define "pd-sidecar.sidecarContainer" -}}
{{- $f := include "pd-sidecar.effectiveFlags" . | fromJson -}}
{{- $port := int (index $f "port") -}}
{{- $dp := int (default 1 (index $f "data-parallel-size")) -}}
{{- $metricsPort := int (default 0 (index $f "metrics-port")) -}}
{{- $scheme := ternary "HTTPS" "HTTP" (eq (toString (index $f "secure-proxy")) "true") -}}
- name: pd-sidecar
  image: {{ printf "%s:%s" .Values.sidecar.image.repository (default .Chart.AppVersion .Values.sidecar.image.tag) | quote }}
  imagePullPolicy: {{ .Values.sidecar.image.pullPolicy }}
  restartPolicy: Always
  args:
  {{- include "pd-sidecar.args" . | nindent 4 }}
  ports:
  {{- range $r := until $dp }}
    - name: {{ ternary "http" (printf "http-r%d" $r) (eq $r 0) }}
      containerPort: {{ add $port $r }}
      protocol: TCP
  {{- end }}
  {{- if ne $metricsPort 0 }}
    - name: metrics
      containerPort: {{ $metricsPort }}
      protocol: TCP
  {{- end }}
  env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
  {{- if eq (toString (index $f "tracing")) "true" }}
  {{- with .Values.sidecar.otel }}
    {{- if .endpoint }}
    - name: OTEL_EXPORTER_OTLP_ENDPOINT
      value: {{ .endpoint | quote }}
    {{- end }}
    {{- if .protocol }}
    - name: OTEL_EXPORTER_OTLP_PROTOCOL
      value: {{ .protocol | quote }}
    {{- end }}
    - name: OTEL_SERVICE_NAME
      value: {{ .serviceName | quote }}
    - name: OTEL_TRACES_SAMPLER
      value: {{ .sampler | quote }}
    - name: OTEL_TRACES_SAMPLER_ARG
      value: {{ .samplerArg | quote }}
  {{- end }}
  {{- end }}
  {{- with .Values.sidecar.gomaxprocs }}
    - name: GOMAXPROCS
    {{- if eq (toString .) "requests" }}
      valueFrom:
        resourceFieldRef:
          containerName: pd-sidecar
          resource: requests.cpu
          divisor: "1"
    {{- else }}
      value: {{ toString . | quote }}
    {{- end }}
  {{- end }}
  {{- with .Values.sidecar.env }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  startupProbe:
    httpGet:
      path: /health
      port: http
      scheme: {{ $scheme }}
    {{- toYaml .Values.sidecar.startupProbe | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /health
      port: http
      scheme: {{ $scheme }}
    {{- toYaml .Values.sidecar.livenessProbe | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /ready
      port: http
      scheme: {{ $scheme }}
    {{- toYaml .Values.sidecar.readinessProbe | nindent 4 }}
  resources:
    {{- toYaml .Values.sidecar.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.sidecar.securityContext | nindent 4 }}
  {{- if or .Values.sidecar.volumeMounts .Values.sidecar.configuration }}
  volumeMounts:
  {{- with .Values.sidecar.volumeMounts }}
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if .Values.sidecar.configuration }}
    - name: pd-sidecar-configuration
      mountPath: {{ include "pd-sidecar.configurationDir" . }}
      readOnly: true
  {{- end }}
  {{- end }}
{{- end -}}

{{/* The decode engine: vLLM serving on the sidecar's model-server-port with
     kv_load_failure_policy forced to "fail". */}}
{{- define "pd-sidecar.engineContainer" -}}
{{- $e := .Values.engine -}}
{{- $policy := index $e.kvTransferConfig "kv_load_failure_policy" -}}
{{- if and $policy (ne $policy "fail") -}}
{{- fail (printf "engine.kvTransferConfig.kv_load_failure_policy must be \"fail\" (got %q): with \"recompute\" the engine silently prefills locally and the sidecar cannot count or recover it" $policy) -}}
{{- end -}}
{{- $kv := merge (dict "kv_load_failure_policy" "fail") $e.kvTransferConfig -}}
{{- $port := int (index (include "pd-sidecar.effectiveFlags" . | fromJson) "model-server-port") -}}
- name: vllm
  image: {{ printf "%s:%s" $e.image.repository $e.image.tag | quote }}
  imagePullPolicy: {{ $e.image.pullPolicy }}
  command: ["vllm", "serve"]
  args:
    - {{ $e.model | quote }}
    - {{ printf "--port=%d" $port | quote }}
    - {{ printf "--tensor-parallel-size=%v" $e.tensorParallelSize | quote }}
    - {{ printf "--kv-transfer-config=%s" (toJson $kv) | quote }}
  {{- range $e.extraArgs }}
    - {{ . | quote }}
  {{- end }}
  ports:
    - name: engine
      containerPort: {{ $port }}
      protocol: TCP
  {{- with $e.env }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  readinessProbe:
    {{- $rp := deepCopy $e.readinessProbe }}
    {{- $_ := set $rp.httpGet "port" "engine" }}
    {{- toYaml $rp | nindent 4 }}
  resources:
    {{- toYaml $e.resources | nindent 4 }}
  securityContext:
    {{- toYaml $e.securityContext | nindent 4 }}
  {{- with .Values.engineVolumeMounts }}
  volumeMounts:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The decode pod spec (the LeaderWorkerSet leader's too). */}}
{{- define "pd-sidecar.podSpec" -}}
serviceAccountName: {{ include "pd-sidecar.serviceAccountName" . }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
initContainers:
  {{- include "pd-sidecar.sidecarContainer" . | nindent 2 }}
containers:
{{- if .Values.engine.enabled }}
  {{- include "pd-sidecar.engineContainer" . | nindent 2 }}
{{- end }}
{{- with .Values.extraContainers }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or .Values.volumes .Values.sidecar.configuration }}
volumes:
{{- with .Values.volumes }}
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.sidecar.configuration }}
  - name: pd-sidecar-configuration
    configMap:
      name: {{ include "pd-sidecar.fullname" . }}-configuration
{{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "pd-sidecar.podLabels" -}}
{{ include "pd-sidecar.selectorLabels" . }}
{{ .Values.workload.roleLabel }}: {{ .Values.workload.roleValue }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The pod's annotations: podAnnotations and, with sidecar.configuration,
     its checksum, so that a changed configuration rolls the pods (the
     sidecar reads its file once, at start). */}}
{{- define "pd-sidecar.podAnnotations" -}}
{{- $a := deepCopy (default (dict) .Values.podAnnotations) -}}
{{- with .Values.sidecar.configuration }}
{{- $_ := set $a "pd-sidecar/configuration-checksum" (toYaml . | sha256sum) -}}
{{- end }}
{{- if $a }}{{ toYaml $a }}{{ end -}}
{{- end -}}
