{{/* The image of lbd, lbctl and the adapter. */}}
{{- define "lbd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "lbd.labels" -}}
app.kubernetes.io/name: lbd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* lbd's configuration for a role: the values' config under what the chart decides.
On LB nodes with the adapter, the socket is open to the adapter's group and the policy
(policy.yaml of the lbd-lb ConfigMap) makes the adapter a writer of its owners only. */}}
{{- define "lbd.config" -}}
{{- $api := dict "socket" "/run/lbd/lbd.sock" -}}
{{- if and (eq .role "lb") .root.Values.adapter.enabled -}}
{{- $_ := set $api "socket_mode" "0660" -}}
{{- $_ := set $api "socket_group" (toString .root.Values.adapter.runAsGroup) -}}
{{- $_ := set $api "policy_file" "/etc/lbd-template/policy.yaml" -}}
{{- end -}}
{{- $fixed := dict "state_dir" "/var/lib/lbd" "api" $api "roles" (list .role) "metrics_listen" (printf "127.0.0.1:%d" (int .root.Values.metricsPort)) -}}
{{- toYaml (mergeOverwrite (deepCopy .config) $fixed) -}}
{{- end -}}

{{/* An HTTP GET probe of the host's loopback: port, path, the values' timing. */}}
{{- define "lbd.probe" -}}
httpGet: {host: 127.0.0.1, port: {{ .port }}, path: {{ .path }}}
{{ toYaml .timing }}
{{- end -}}

{{/* The lbd container of a DaemonSet, with its probes; configVolume holds lbd.yaml,
and with policy the template volume holds policy.yaml. */}}
{{- define "lbd.container" -}}
- name: lbd
  image: {{ include "lbd.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: [/usr/local/bin/lbd, --config, /etc/lbd/lbd.yaml]
  securityContext:
    privileged: true
  readinessProbe:
    {{- include "lbd.probe" (dict "port" .root.Values.metricsPort "path" "/readyz" "timing" .root.Values.probes.readiness) | nindent 4 }}
  livenessProbe:
    {{- include "lbd.probe" (dict "port" .root.Values.metricsPort "path" "/healthz" "timing" .root.Values.probes.liveness) | nindent 4 }}
  {{- with .resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - {name: {{ .configVolume }}, mountPath: /etc/lbd, readOnly: true}
    {{- if .policy }}
    - {name: template, mountPath: /etc/lbd-template, readOnly: true}
    {{- end }}
    - {name: run, mountPath: /run/lbd}
    - {name: state, mountPath: /var/lib/lbd}
    - {name: bpffs, mountPath: /sys/fs/bpf}
{{- end -}}
