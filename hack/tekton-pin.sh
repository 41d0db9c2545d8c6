#!/usr/bin/env bash
# hack/tekton-pin.sh IMAGE@sha256:DIGEST < buildlock-deploy.yaml prints the
# Tekton Task with its `image` param defaulting to IMAGE, pinned by digest:
# the release workflow attaches the result to each release. In the
# repository the default is the placeholder below, which names no image;
# test/examples/tekton checks that this script replaces it, and only it.
set -euo pipefail

placeholder='ghcr.io/buildlock/kubectl-buildlock:unreleased@sha256:0000000000000000000000000000000000000000000000000000000000000000'
if [[ $# -ne 1 || ! $1 =~ ^[a-z0-9./:-]+(:[A-Za-z0-9._-]+)?@sha256:[a-f0-9]{64}$ ]]; then
	echo "usage: $0 IMAGE[:TAG]@sha256:DIGEST < task.yaml" >&2
	exit 2
fi
task=$(cat)
if [[ $(grep -c -F "default: $placeholder" <<<"$task") -ne 1 ]]; then
	echo "the Task must default its image param to the placeholder exactly once: default: $placeholder" >&2
	exit 1
fi
printf '%s\n' "${task//"default: $placeholder"/"default: $1"}"
