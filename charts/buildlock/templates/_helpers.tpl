{{/*
The chart's name, overridable with nameOverride.
*/}}
{{- define "buildlock.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: the release name when it already contains the
chart's name (a release named buildlock gives "buildlock"), else
<release>-<chart>. Names derived from it add at most 17 characters, so it
is cut at 46.
*/}}
{{- define "buildlock.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "buildlock.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "buildlock.labels" -}}
helm.sh/chart: {{ include "buildlock.chart" . }}
{{ include "buildlock.selectorLabels" . }}
app.kubernetes.io/version: {{ include "buildlock.imageTag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: buildlock
{{- end }}

{{/*
Labels that select the manager's pods.
*/}}
{{- define "buildlock.selectorLabels" -}}
app.kubernetes.io/name: {{ include "buildlock.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "buildlock.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "buildlock.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image tag: image.tag, else the chart's appVersion. toString, because
`--set image.tag=20260115` gives the template an integer.
*/}}
{{- define "buildlock.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion | toString }}
{{- end }}

{{- define "buildlock.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "buildlock.imageTag" .) }}
{{- end }}

{{/*
The rules of a ClusterRole kept in files/: the chart does not restate RBAC
rules, it renders the copies `make chart-sync` takes of config/rbac.
*/}}
{{- define "buildlock.rulesFrom" -}}
{{- $role := .root.Files.Get .file | fromYaml }}
{{- if not $role.rules }}
{{- fail (printf "%s holds no rules; run `make chart-sync`" .file) }}
{{- end }}
{{- toYaml $role.rules }}
{{- end }}

{{/*
The rules of the manager's role (files/rbac/role.yaml) on cluster-scoped
resources: namespaces, admission policies and their bindings, the probe user
it impersonates. A RoleBinding cannot grant
those, so with watchNamespaces they are bound cluster-wide on their own.
TestChart checks this list against the API server's discovery.
*/}}
{{- define "buildlock.clusterScopedManagerRules" -}}
{{- $clusterScoped := list "namespaces" "nodes" "persistentvolumes" "customresourcedefinitions" "clusterroles" "clusterrolebindings" "validatingadmissionpolicies" "validatingadmissionpolicybindings" "mutatingadmissionpolicies" "mutatingadmissionpolicybindings" "validatingwebhookconfigurations" "mutatingwebhookconfigurations" "tokenreviews" "subjectaccessreviews" "users" }}
{{- $role := .Files.Get "files/rbac/role.yaml" | fromYaml }}
{{- $rules := list }}
{{- range $role.rules }}
{{- $resources := list }}
{{- range .resources }}
{{- if has (first (splitList "/" .)) $clusterScoped }}
{{- $resources = append $resources . }}
{{- end }}
{{- end }}
{{- if $resources }}
{{- $rule := dict "apiGroups" .apiGroups "resources" $resources "verbs" .verbs }}
{{- with .resourceNames }}
{{- $_ := set $rule "resourceNames" . }}
{{- end }}
{{- $rules = append $rules $rule }}
{{- end }}
{{- end }}
{{- if $rules }}
{{- toYaml $rules }}
{{- end }}
{{- end }}

{{/*
The seconds of an hours-minutes-seconds duration ("1h30m" is 5400), for
alert thresholds: PromQL compares numbers, and the schema keeps thresholds
to that form.
*/}}
{{- define "buildlock.seconds" -}}
{{- $total := 0 }}
{{- range regexFindAll "[0-9]+[hms]" . -1 }}
{{- $n := regexFind "[0-9]+" . | atoi }}
{{- $total = add $total (mul $n (get (dict "h" 3600 "m" 60 "s" 1) (trimPrefix (toString $n) .))) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
An alert's labels: its severity and prometheusRule.alertLabels.
*/}}
{{- define "buildlock.alertLabels" -}}
severity: {{ .severity }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
"true" when the cluster serves MutatingAdmissionPolicies
(admissionregistration.k8s.io/v1, Kubernetes 1.36 or newer): as discovery
says when Helm talks to a cluster (install, upgrade, template --validate),
and by the Kubernetes version for a `helm template` without one, whose API
versions name no kinds.
*/}}
{{- define "buildlock.servesMutatingAdmissionPolicies" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" -}}
true
{{- else if and (not (.Capabilities.APIVersions.Has "v1/Namespace")) (semverCompare ">=1.36-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end }}

{{/*
The documents of the chart's copies of config/ files matching glob (dict
root, glob), each as it is, but for those labelled buildlock.io/requires:
MutatingAdmissionPolicy on a cluster that serves none.
*/}}
{{- define "buildlock.admissionPolicies" -}}
{{- $mutating := eq (include "buildlock.servesMutatingAdmissionPolicies" .root) "true" }}
{{- range $path, $_ := .root.Files.Glob .glob }}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" ($.root.Files.Get $path) -1 }}
{{- if and (regexMatch "(?m)^kind:" $doc) (or $mutating (not (contains "buildlock.io/requires: MutatingAdmissionPolicy" $doc))) }}
---
{{ trim $doc }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
