{{/* The chart's name, or nameOverride. */}}
{{- define "autoapproval.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object name: fullnameOverride, else the release name (plus the chart name unless it already contains it). */}}
{{- define "autoapproval.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of the controller's objects. */}}
{{- define "autoapproval.labels" -}}
{{- include "autoapproval.labelsOf" (list . "controller") }}
{{- end }}

{{/* Labels of the objects of one component: (list $ "component"). */}}
{{- define "autoapproval.labelsOf" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "autoapproval.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
app.kubernetes.io/version: {{ $.Chart.AppVersion | quote }}
{{- if $.Values.helmHooks }}
app.kubernetes.io/managed-by: {{ $.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $.Chart.Name $.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels that select the controller pods. */}}
{{- define "autoapproval.selectorLabels" -}}
app.kubernetes.io/name: {{ include "autoapproval.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{/* The controller's ServiceAccount. */}}
{{- define "autoapproval.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "autoapproval.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The existing Secret holding the database URLs and tokens. */}}
{{- define "autoapproval.secretName" -}}
{{- default (include "autoapproval.fullname" .) .Values.secret.name }}
{{- end }}

{{/* The image reference: repository@digest when a digest is set (the tag is then ignored), else repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "autoapproval.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}
{{- end }}

{{/*
RUST_LOG from logLevel, for the controller and the migration; nothing when empty. The binary's
own default filter turns kube's client's request errors off (the caller reports each once); a
filter given here replaces that default, so it carries the same directive.
*/}}
{{- define "autoapproval.logEnv" -}}
{{- with .Values.logLevel -}}
- name: RUST_LOG
  value: {{ printf "%s,kube_client::client::builder=off" . | quote }}
{{- end }}
{{- end }}

{{/* The port of config.listen (host:port or [v6]:port): the container port. */}}
{{- define "autoapproval.port" -}}
{{- $port := .Values.config.listen | toString | splitList ":" | last }}
{{- if not (regexMatch "^[0-9]+$" $port) }}
{{- fail (printf "config.listen %q must end with :<port>" (toString .Values.config.listen)) }}
{{- end }}
{{- $port }}
{{- end }}

{{/*
Whole seconds (rounded up) of a duration as `autoapproval run` reads it: 0, 25s, 1m30s, 500ms, 2h, 1d.
It sizes terminationGracePeriodSeconds from config.shutdownGrace, so the two cannot drift apart.
*/}}
{{- define "autoapproval.seconds" -}}
{{- $text := toString . | trim }}
{{- if eq $text "0" }}
{{- 0 }}
{{- else }}
{{- if not (regexMatch "^([0-9]+(ns|us|µs|ms|sec|s|min|m|h|d) *)+$" $text) }}
{{- fail (printf "%q is not a duration such as 25s, 1m or 1m30s" $text) }}
{{- end }}
{{- $nanos := dict "ns" 1 "us" 1000 "µs" 1000 "ms" 1000000 "s" 1000000000 "sec" 1000000000 "m" 60000000000 "min" 60000000000 "h" 3600000000000 "d" 86400000000000 }}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+[^0-9 ]+" $text -1 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $total = add $total (mul (regexFind "^[0-9]+" . | int64) (get $nanos $unit)) }}
{{- end }}
{{- div (add $total 999999999) 1000000000 }}
{{- end }}
{{- end }}

{{/*
The migration container, for the hook Job and (plain manifests) the Deployment's init container.
It connects with secret.keys.migrationDatabaseUrl when given: the owner role's URL, so that role
owns what migrate creates and the controller's role nothing (docs/INTEGRATING.md#grants).
*/}}
{{- define "autoapproval.migrateContainer" -}}
- name: migrate
  image: {{ include "autoapproval.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["migrate"{{ if .Values.migrations.referenceSchema }}, "--reference-schema"{{ end }}]
  env:
    - name: AUTOAPPROVAL_DATABASE_URL
      valueFrom:
        secretKeyRef:
          name: {{ include "autoapproval.secretName" . }}
          key: {{ default (required "secret.keys.databaseUrl names the Secret key of the database URL" .Values.secret.keys.databaseUrl) .Values.secret.keys.migrationDatabaseUrl }}
    - name: AUTOAPPROVAL_LOG_JSON
      value: {{ toString .Values.config.logJson | quote }}
    {{- with include "autoapproval.vocabularyEnv" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "autoapproval.logEnv" . }}
    {{- . | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml .Values.migrations.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with include "autoapproval.jobVolumeMounts" . | trim }}
  volumeMounts:
    {{- . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
The certificates of tls.volumes (CA bundles, client certificates and keys): each Secret or
ConfigMap a read-only volume `tls-<name>`, mounted at /etc/autoapproval/tls/<name>/ in every
container that connects (the controller, the migration Job's migrate and check, the init container), its keys as
files. The drivers read the files at each new connection, so a rotated Secret needs no restart.
*/}}
{{- define "autoapproval.tlsVolumes" -}}
{{- $seen := dict }}
{{- range .Values.tls.volumes }}
{{- if hasKey $seen .name }}
{{- fail (printf "tls.volumes: the name %q is given twice (each is a folder under /etc/autoapproval/tls/)" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
- name: tls-{{ .name }}
  {{- if .secret }}
  secret:
    secretName: {{ .secret | quote }}
  {{- else }}
  configMap:
    name: {{ .configMap | quote }}
  {{- end }}
    {{- with .items }}
    items:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- if hasKey . "defaultMode" }}
    defaultMode: {{ .defaultMode }}
    {{- end }}
{{- end }}
{{- end }}

{{/*
The vocabulary (values `vocabulary`): its ConfigMap a read-only volume, the file at
/etc/autoapproval/vocabulary/vocabulary.yaml, named by AUTOAPPROVAL_VOCABULARY, in every container
that binds statements or stores the vocabulary (the controller, migrate, check). Nothing when
empty: the binary's default, our own words. The hook Job mounts the hook copy, the only one that
exists before the chart's other objects (argument: the ConfigMap's name suffix).
*/}}
{{- define "autoapproval.vocabularyDir" -}}/etc/autoapproval/vocabulary{{- end }}

{{- define "autoapproval.vocabularyEnv" -}}
{{- if .Values.vocabulary -}}
- name: AUTOAPPROVAL_VOCABULARY
  value: {{ include "autoapproval.vocabularyDir" . }}/vocabulary.yaml
{{- end }}
{{- end }}

{{- define "autoapproval.vocabularyVolumeMount" -}}
{{- if .Values.vocabulary -}}
- name: vocabulary
  mountPath: {{ include "autoapproval.vocabularyDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The vocabulary's volume; `list . "vocabulary"` or `list . "migrate-vocabulary"`. */}}
{{- define "autoapproval.vocabularyVolume" -}}
{{- $root := index . 0 }}
{{- if $root.Values.vocabulary -}}
- name: vocabulary
  configMap:
    name: {{ include "autoapproval.fullname" $root }}-{{ index . 1 }}
{{- end }}
{{- end }}

{{/* The mounts of the containers that connect beside the controller: TLS and the vocabulary. */}}
{{- define "autoapproval.jobVolumeMounts" -}}
{{ include "autoapproval.tlsVolumeMounts" . }}
{{ include "autoapproval.vocabularyVolumeMount" . }}
{{- end }}

{{/* The mounts of tls.volumes: /etc/autoapproval/tls/<name>/, read-only. */}}
{{- define "autoapproval.tlsVolumeMounts" -}}
{{- range .Values.tls.volumes }}
- name: tls-{{ .name }}
  mountPath: /etc/autoapproval/tls/{{ .name }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
The hook Job's check after migrate: `autoapproval check` with the controller's own URL and
session limits, the start-up check of `run`, so a release whose replicas would refuse to start
fails at install, naming the view or grant (`kubectl logs job/<release>-migrate`). Its last
lines become the pod's termination message, kept after the logs are gone.
*/}}
{{- define "autoapproval.checkContainer" -}}
- name: check
  image: {{ include "autoapproval.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args: ["check"]
  terminationMessagePolicy: FallbackToLogsOnError
  env:
    - name: AUTOAPPROVAL_DATABASE_URL
      valueFrom:
        secretKeyRef:
          name: {{ include "autoapproval.secretName" . }}
          key: {{ required "secret.keys.databaseUrl names the Secret key of the database URL" .Values.secret.keys.databaseUrl }}
    {{- range $name, $value := dict "AUTOAPPROVAL_DB_LOCK_TIMEOUT" .Values.config.dbLockTimeout "AUTOAPPROVAL_DB_STATEMENT_TIMEOUT" .Values.config.dbStatementTimeout }}
    {{- if and (not (kindIs "invalid" $value)) (ne (toString $value) "") }}
    - name: {{ $name }}
      value: {{ toString $value | quote }}
    {{- end }}
    {{- end }}
    - name: AUTOAPPROVAL_LOG_JSON
      value: {{ toString .Values.config.logJson | quote }}
    {{- with include "autoapproval.vocabularyEnv" . }}
    {{- . | nindent 4 }}
    {{- end }}
    {{- with include "autoapproval.logEnv" . }}
    {{- . | nindent 4 }}
    {{- end }}
  resources:
    {{- toYaml .Values.migrations.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- with include "autoapproval.jobVolumeMounts" . | trim }}
  volumeMounts:
    {{- . | nindent 4 }}
  {{- end }}
{{- end }}

{{/*
The env entries read from the existing Secret: the database URL must be there, the read replica
and the tokens may be absent (their variables are then unset). An empty key name drops the entry.
*/}}
{{- define "autoapproval.secretEnv" -}}
{{- $secret := include "autoapproval.secretName" . }}
{{- $keys := .Values.secret.keys -}}
- name: AUTOAPPROVAL_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ required "secret.keys.databaseUrl names the Secret key of the database URL" $keys.databaseUrl }}
{{- $optional := dict
  "AUTOAPPROVAL_READ_DATABASE_URL" $keys.readDatabaseUrl
  "AUTOAPPROVAL_ESIGN_TOKEN" $keys.esignToken
  "AUTOAPPROVAL_OWNER_TOKEN" $keys.ownerToken
  "AUTOAPPROVAL_STORE_TOKEN" $keys.storeToken
  "AUTOAPPROVAL_AD_TOKEN" $keys.adToken
}}
{{- range $name, $key := $optional }}
{{- if $key }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end }}
{{- end }}

{{/* The PromQL label matchers that select this release's series: the namespace and the job the ServiceMonitor (or your scrape config) gives them. */}}
{{- define "autoapproval.promSelector" -}}
namespace="{{ .Release.Namespace }}", job="{{ default (include "autoapproval.fullname" .) .Values.prometheusRule.job }}"
{{- end }}

{{/*
extraEnv, refused when it names a variable the chart sets in `env` itself: a duplicate name is
ambiguous (server-side apply refuses it), and these come from the pod and the Secret.
*/}}
{{- define "autoapproval.extraEnv" -}}
{{- $own := list "AUTOAPPROVAL_NAMESPACE" "AUTOAPPROVAL_REPLICA_NAME" "AUTOAPPROVAL_DATABASE_URL" "AUTOAPPROVAL_READ_DATABASE_URL" "AUTOAPPROVAL_ESIGN_TOKEN" "AUTOAPPROVAL_OWNER_TOKEN" "AUTOAPPROVAL_STORE_TOKEN" "AUTOAPPROVAL_AD_TOKEN" }}
{{- if .Values.logLevel }}
{{- $own = append $own "RUST_LOG" }}
{{- end }}
{{- range .Values.extraEnv }}
{{- if has .name $own }}
{{- fail (printf "extraEnv[].name %s is set by the chart: use its value (logLevel, secret.keys, config) instead" .name) }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{- toYaml . }}
{{- end }}
{{- end }}
