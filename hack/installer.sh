#!/usr/bin/env bash
# hack/installer.sh KUBECTL IMAGE prints the installer: config/default
# rendered by `kubectl kustomize` (no kustomize binary needed), with the
# manager's image set to IMAGE (repository:tag) by a throwaway overlay, so
# that nothing under config/ changes. `make deploy` applies it, `make
# build-installer` writes it to dist/install.yaml, and test/chart applies it
# to a local control plane.
set -euo pipefail

if [[ $# -ne 2 ]]; then
	echo "usage: $0 KUBECTL IMAGE" >&2
	exit 2
fi
kubectl=$1
image=$2
name=${image%:*}
tag=${image##*:}
if [[ $image != *:* || $tag == */* || -z $name || -z $tag ]]; then
	echo "the image must be repository:tag, is $image" >&2
	exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
# kustomize takes only relative paths: climb from the overlay to / (each
# component of its path becomes ..), then down to config/default.
up=$(printf '%s' "$overlay" | sed 's|[^/][^/]*|..|g')
cat >"$overlay/kustomization.yaml" <<EOF
resources:
- ${up#/}$root/config/default
images:
- name: ghcr.io/buildlock/buildlock
  newName: $name
  newTag: "$tag"
EOF
"$kubectl" kustomize "$overlay"
