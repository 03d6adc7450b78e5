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

{{/* The models with a generator (runtime/model/config.h), which run a
third module of workers. */}}
{{- define "loom.hasGenerator" -}}
{{- if and (not .Values.job.hf) (has .Values.job.model (list "tiny-gen" "vit300m-llm7b-gen" "vit300m-llm70b-gen")) -}}
true
{{- end -}}
{{- end -}}

{{/* A module's ranks, its grid: parallel.<module>_tp x _pp x _dp (each
unset: 1). Call with (list $ "llm"); `int` the result. */}}
{{- define "loom.moduleRanks" -}}
{{- $p := (index . 0).Values.job.parallel -}}
{{- $m := index . 1 -}}
{{- mul (index $p (printf "%s_dp" $m) | default 1) (index $p (printf "%s_tp" $m) | default 1) (index $p (printf "%s_pp" $m) | default 1) -}}
{{- end -}}

{{/* The worker modules, comma-separated: encoder,llm[,generator]. */}}
{{- define "loom.workerModules" -}}
encoder,llm{{ if include "loom.hasGenerator" . }},generator{{ end }}
{{- end -}}

{{- define "loom.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The workers' image: the CUDA build where they get GPUs. */}}
{{- define "loom.workerImage" -}}
{{- if .Values.gpu.enabled -}}
{{ .Values.gpuImage.repository }}:{{ .Values.gpuImage.tag | default .Chart.AppVersion }}
{{- else -}}
{{ include "loom.image" . }}
{{- end -}}
{{- end -}}

{{/* The flags every Loom service takes (services/common/chassis). */}}
{{- define "loom.chassisArgs" -}}
- --host=0.0.0.0
- --grpc_port={{ .Values.ports.grpc }}
- --metrics_port={{ .Values.ports.metrics }}
{{- if .Values.tls.enabled }}
- --tls_dir=/etc/loom/tls
- --tls_server_name={{ .Values.tls.serverName }}
- --tls_refresh={{ .Values.tls.refresh }}
{{- else }}
- --insecure
{{- end }}
{{- end -}}

{{/* The TLS Secret of an identity (scheduler, preprocess, worker: ca.crt,
tls.crt, tls.key; the certificate's common name loom-<identity>), readable
by the pods' group (fsGroup); Kubernetes swaps its files in place when the
Secret changes and the services read them again (tls.refresh).
Call with (list $ "worker"). */}}
{{- define "loom.tlsSecretName" -}}
{{- $ := index . 0 -}}
{{- $id := index . 1 -}}
{{- index $.Values.tls.secrets $id | default (printf "%s-tls-%s" (include "loom.fullname" $) $id) -}}
{{- end -}}

{{- define "loom.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/loom/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "loom.tlsVolume" -}}
{{- $ := index . 0 -}}
{{- if $.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "loom.tlsSecretName" . }}
    defaultMode: 0440
    items:
      - {key: ca.crt, path: ca.crt}
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
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
{{/* Kubelet's gRPC probes speak plaintext: under TLS the probe is
loomctl health, in the container, with the job's CA. */}}
{{- define "loom.probes" -}}
{{- $ := index . 0 -}}
livenessProbe:
  {{- include "loom.probeAction" (list $ "") | nindent 2 }}
  initialDelaySeconds: 5
  periodSeconds: 10
  failureThreshold: 6
readinessProbe:
  {{- include "loom.probeAction" (list $ (index . 1)) | nindent 2 }}
  periodSeconds: 5
{{- end -}}

{{- define "loom.probeAction" -}}
{{- $ := index . 0 -}}
{{- if $.Values.tls.enabled }}
exec:
  command: ["/usr/local/bin/loomctl", "--scheduler=127.0.0.1:{{ $.Values.ports.grpc }}", "--tls_dir=/etc/loom/tls", "--tls_server_name={{ $.Values.tls.serverName }}", "--timeout=4s", "health", {{ index . 1 | quote }}]
timeoutSeconds: 5
{{- else }}
grpc:
  port: {{ $.Values.ports.grpc }}
  {{- if index . 1 }}
  service: {{ index . 1 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "loom.ucxEnv" -}}
{{- range $k, $v := .Values.env.ucx }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{/* Checkpoints are on when the job writes them (job.checkpoint.every > 0),
a resume reads one (resumeStep > 0), or the job is not the chart's to see
(submitOnStart false: `loomctl submit` brings it, and it may checkpoint).
Then every pod must mount one shared claim: with an emptyDir per pod each
worker writes its part into its own pod and the scheduler commits step-N in
its own, so the first recovery finds nothing to load and the workers'
step-N.partial folders are never removed. Rendering fails instead. The
checkpoint folder must be on that claim too (under its mountPath). Off
(every 0, no resume, the chart's job), the volume is an emptyDir: a lost
process restarts the job from its seed. */}}
{{- define "loom.checkpointsShared" -}}
{{- $ck := .Values.job.checkpoint | default dict -}}
{{- $every := int ($ck.every | default 0) -}}
{{- $mount := .Values.storage.checkpoints.mountPath | trimSuffix "/" -}}
{{- $reasons := list -}}
{{- if gt $every 0 }}{{ $reasons = append $reasons (printf "job.checkpoint.every = %d" $every) }}{{ end -}}
{{- if gt (int .Values.resumeStep) 0 }}{{ $reasons = append $reasons (printf "resumeStep = %d" (int .Values.resumeStep)) }}{{ end -}}
{{- if not .Values.submitOnStart }}{{ $reasons = append $reasons "submitOnStart = false: the job comes from loomctl submit and may checkpoint" }}{{ end -}}
{{- if and $reasons (not .Values.storage.checkpoints.existingClaim) -}}
{{- $msg := printf "storage.checkpoints.existingClaim is empty but checkpoints are on (%s). Name an existing ReadWriteMany PersistentVolumeClaim that every Loom pod (scheduler, loom-preprocess, every worker) mounts at storage.checkpoints.mountPath (%s): --set storage.checkpoints.existingClaim=CLAIM. Without one each pod writes into its own emptyDir, the scheduler commits steps whose parts are in other pods, and the first recovery finds nothing to load. Or turn checkpoints off: job.checkpoint.every=0, resumeStep=0, submitOnStart=true (a lost process then restarts the job from its seed)." (join "; " $reasons) $mount -}}
{{- fail $msg -}}
{{- end -}}
{{- if and $reasons $ck.dir (not (hasPrefix (printf "%s/" $mount) (printf "%s/" ($ck.dir | trimSuffix "/")))) -}}
{{- $msg := printf "job.checkpoint.dir %s is not on the checkpoint claim: it must be under storage.checkpoints.mountPath (%s), where every pod mounts storage.checkpoints.existingClaim." $ck.dir $mount -}}
{{- fail $msg -}}
{{- end -}}
{{- end -}}

{{- define "loom.checkpointVolume" -}}
{{- include "loom.checkpointsShared" . -}}
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
{{- $ := index . 0 -}}
{{- $p := index . 1 -}}
{{- with $p.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- /* Jobs: a pod on a node that stopped answering is evicted after
workload.nodeLostSeconds, and its Job starts it again elsewhere. */ -}}
{{- $tolerations := $p.tolerations | default list }}
{{- if eq $.Values.workload.kind "Job" }}
{{- $secs := int $.Values.workload.nodeLostSeconds }}
{{- range $key := list "node.kubernetes.io/unreachable" "node.kubernetes.io/not-ready" }}
{{- $tolerations = append $tolerations (dict "key" $key "operator" "Exists" "effect" "NoExecute" "tolerationSeconds" $secs) }}
{{- end }}
{{- end }}
{{- with $tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $p.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A workload's kind and the head of its spec: a Job (workload.kind Job:
it ends with the job; created suspended for Kueue when workload.kueue.
queueName names a queue, which admits it) or, for the StatefulSet kind,
a Deployment (scheduler, preprocess) or StatefulSet (workers) that serves
on. Call with (list $ "Deployment"|"StatefulSet" component). */}}
{{- define "loom.workloadKind" -}}
{{- $ := index . 0 -}}
{{- if eq $.Values.workload.kind "Job" -}}
apiVersion: batch/v1
kind: Job
{{- else -}}
apiVersion: apps/v1
kind: {{ index . 1 }}
{{- end -}}
{{- end -}}

{{- define "loom.workloadLabels" -}}
{{- if and (eq .Values.workload.kind "Job") .Values.workload.kueue.queueName -}}
kueue.x-k8s.io/queue-name: {{ .Values.workload.kueue.queueName }}
{{- end -}}
{{- end -}}

{{- define "loom.jobSpec" -}}
{{- if .Values.workload.kueue.queueName }}
suspend: true  # until Kueue admits it
{{- end }}
backoffLimit: {{ int .Values.workload.backoffLimit }}
ttlSecondsAfterFinished: {{ int .Values.workload.ttlSecondsAfterFinished }}
{{- end -}}

{{/* Pod labels and scheduler of a gang (workload.podGroup: every Loom pod
in one scheduler-plugins PodGroup, scheduled all or none). */}}
{{- define "loom.podGroupLabel" -}}
{{- if .Values.workload.podGroup.enabled -}}
scheduling.x-k8s.io/pod-group: {{ include "loom.fullname" . }}
{{- end -}}
{{- end -}}

{{- define "loom.podScheduler" -}}
{{- if .Values.workload.podGroup.enabled -}}
schedulerName: {{ .Values.workload.podGroup.schedulerName }}
{{- end -}}
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

{{/* A mixture (job.data.sources) as loom-preprocess's --shards: GLOB=WEIGHT,... */}}
{{- define "loom.mixture" -}}
{{- $parts := list -}}
{{- range . -}}
{{- $parts = append $parts (printf "%s=%v" .shards (.weight | default 1)) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}
