{{/* Names: <release>-loom unless the release name already says loom. */}}
{{- define "loom.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "loom.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: pass (list $ "scheduler"). */}}
{{- define "loom.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "loom.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The flags every Loom service takes (services/common/chassis). */}}
{{- define "loom.chassisArgs" -}}
- --host=0.0.0.0
- --grpc_port={{ .Values.ports.grpc }}
- --metrics_port={{ .Values.ports.metrics }}
{{- end -}}

{{- define "loom.ports" -}}
- name: grpc
  containerPort: {{ .Values.ports.grpc }}
  protocol: TCP
- name: metrics
  containerPort: {{ .Values.ports.metrics }}
  protocol: TCP
{{- end -}}

{{/* grpc.health.v1 probes: liveness on the server, readiness on the service. */}}
{{- define "loom.probes" -}}
{{- $ := index . 0 -}}
livenessProbe:
  grpc:
    port: {{ $.Values.ports.grpc }}
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  grpc:
    port: {{ $.Values.ports.grpc }}
    service: {{ index . 1 }}
  periodSeconds: 5
{{- end -}}

{{- define "loom.ucxEnv" -}}
{{- range $k, $v := .Values.env.ucx }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- define "loom.checkpointVolume" -}}
- name: checkpoints
{{- if .Values.storage.checkpoints.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.storage.checkpoints.existingClaim }}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* The Hugging Face model directories (job.hf), read-only, where the job
says they are: storage.models.existingClaim at storage.models.mountPath. */}}
{{- define "loom.modelsMount" -}}
{{- if .Values.storage.models.existingClaim }}
- name: models
  mountPath: {{ .Values.storage.models.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "loom.modelsVolume" -}}
{{- if .Values.storage.models.existingClaim }}
- name: models
  persistentVolumeClaim:
    claimName: {{ .Values.storage.models.existingClaim }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "loom.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}


{{/* Pod-level lock-down: Loom's ServiceAccount, no API token (Loom never
calls the Kubernetes API), a non-root user and the runtime's seccomp profile. */}}
{{- define "loom.podSecurity" -}}
serviceAccountName: {{ include "loom.fullname" . }}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.security.runAsUser }}
  runAsGroup: {{ .Values.security.runAsUser }}
  fsGroup: {{ .Values.security.runAsUser }}
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* A container's lock-down: every capability dropped (IPC_LOCK added back
for RDMA memory registration: pass (list $ true)), no privilege escalation,
a read-only root file system (the writable places are volumes: /tmp, the
checkpoints, /dev/shm). */}}
{{- define "loom.containerSecurity" -}}
{{- $ := index . 0 -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: {{ $.Values.security.readOnlyRootFilesystem }}
  capabilities:
    drop: ["ALL"]
    {{- if index . 1 }}
    add: ["IPC_LOCK"]  # RDMA memory registration
    {{- end }}
{{- end -}}

{{- define "loom.tmpMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "loom.tmpVolume" -}}
- name: tmp
  emptyDir: {}
{{- end -}}
