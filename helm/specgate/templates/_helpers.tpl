{{/* Names and labels. */}}
{{- define "specgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specgate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "specgate.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "specgate.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "specgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "specgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "specgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "specgate.gatewayImage" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* One pool replica: its Deployment/Service name. Args: dict root, pool (name), index. */}}
{{- define "specgate.replicaName" -}}
{{- printf "%s-%s-%d" (include "specgate.fullname" .root) .pool (int .index) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "specgate.poolPort" -}}
{{- .Values.vllm.port | int -}}
{{- end -}}

{{/* The rules file: the user's rules plus `pools:` listing every pool replica's Service URL. */}}
{{- define "specgate.rulesFile" -}}
{{- $pools := dict -}}
{{- range $name, $pool := .Values.pools -}}
{{- $urls := list -}}
{{- range $i := until (int $pool.replicas) -}}
{{- $host := include "specgate.replicaName" (dict "root" $ "pool" $name "index" $i) -}}
{{- $urls = append $urls (printf "http://%s:%d" $host (int $.Values.vllm.port)) -}}
{{- end -}}
{{- $_ := set $pools $name (dict "replicas" $urls) -}}
{{- end -}}
{{- $rules := deepCopy .Values.gateway.rules -}}
{{- $_ := set $rules "pools" $pools -}}
{{- toYaml $rules -}}
{{- end -}}

{{/*
The speculative pool's --speculative-config JSON, keys in the renderer's order (backends/render.py):
method, model, num_speculative_tokens, draft_tensor_parallel_size, prompt_lookup_max, prompt_lookup_min,
num_speculative_tokens_per_batch_size (vLLM's dynamic speculation, only when set).
Fields the method does not use are left out (values merged over the defaults may still carry them).
*/}}
{{- define "specgate.speculativeConfig" -}}
{{- $withWeights := has .method (list "draft_model" "eagle" "eagle3" "medusa") -}}
{{- $parts := list (printf "\"method\":%s" (toJson .method)) -}}
{{- if and $withWeights .draftModel -}}
{{- $parts = append $parts (printf "\"model\":%s" (toJson .draftModel)) -}}
{{- end -}}
{{- $parts = append $parts (printf "\"num_speculative_tokens\":%d" (int .numSpeculativeTokens)) -}}
{{- if and $withWeights (not (kindIs "invalid" .draftTensorParallelSize)) -}}
{{- $parts = append $parts (printf "\"draft_tensor_parallel_size\":%d" (int .draftTensorParallelSize)) -}}
{{- end -}}
{{- if eq .method "ngram" -}}
{{- if not (kindIs "invalid" .promptLookupMax) -}}
{{- $parts = append $parts (printf "\"prompt_lookup_max\":%d" (int .promptLookupMax)) -}}
{{- end -}}
{{- if not (kindIs "invalid" .promptLookupMin) -}}
{{- $parts = append $parts (printf "\"prompt_lookup_min\":%d" (int .promptLookupMin)) -}}
{{- end -}}
{{- end -}}
{{- if .numSpeculativeTokensPerBatchSize -}}
{{- $parts = append $parts (printf "\"num_speculative_tokens_per_batch_size\":%s" (toJson .numSpeculativeTokensPerBatchSize)) -}}
{{- end -}}
{{- printf "{%s}" (join "," $parts) -}}
{{- end -}}

{{/* `vllm serve MODEL` arguments for one pool, as the renderer's render_engine_args. Args: dict root, pool. */}}
{{- define "specgate.vllmArgs" -}}
{{- $p := .pool -}}
{{- $args := list $p.model "--served-model-name" $p.servedModelName -}}
{{- $args = concat $args (list "--tensor-parallel-size" (toString (int $p.tensorParallelSize))) -}}
{{- $args = concat $args (list "--pipeline-parallel-size" (toString (int (default 1 $p.pipelineParallelSize)))) -}}
{{- if not (kindIs "invalid" $p.gpuMemoryUtilization) -}}
{{- $args = concat $args (list "--gpu-memory-utilization" (toString $p.gpuMemoryUtilization)) -}}
{{- end -}}
{{- if not (kindIs "invalid" $p.maxModelLen) -}}
{{- $args = concat $args (list "--max-model-len" (toString (int $p.maxModelLen))) -}}
{{- end -}}
{{- if not (kindIs "invalid" $p.maxNumSeqs) -}}
{{- $args = concat $args (list "--max-num-seqs" (toString (int $p.maxNumSeqs))) -}}
{{- end -}}
{{- $args = concat $args (list "--port" (toString (int .root.Values.vllm.port))) -}}
{{- if $p.speculative -}}
{{- $args = concat $args (list "--speculative-config" (include "specgate.speculativeConfig" $p.speculative)) -}}
{{- end -}}
{{- $args = concat $args (default list $p.extraArgs) -}}
{{- toYaml $args -}}
{{- end -}}

{{/* GPUs one replica of a pool takes: tensor x pipeline parallel size. */}}
{{- define "specgate.gpusPerReplica" -}}
{{- mul (int .tensorParallelSize) (int (default 1 .pipelineParallelSize)) -}}
{{- end -}}

{{- define "specgate.redisUrlEnv" -}}
{{- if eq .Values.redis.mode "bundled" }}
- name: SPECGATE_REDIS_URL
  value: {{ printf "redis://%s-redis:6379/0" (include "specgate.fullname" .) | quote }}
{{- else if and (eq .Values.redis.mode "external") .Values.redis.urlSecret.name }}
- name: SPECGATE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.urlSecret.name }}
      key: {{ .Values.redis.urlSecret.key }}
{{- else if eq .Values.redis.mode "external" }}
- name: SPECGATE_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- end }}
{{- end -}}

{{- define "specgate.hfTokenSecretName" -}}
{{- default (printf "%s-hf-token" (include "specgate.fullname" .)) .Values.vllm.hfToken.existingSecret -}}
{{- end -}}

{{- define "specgate.restrictedSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
