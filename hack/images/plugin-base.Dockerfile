# The base of the plugin's image, ghcr.io/buildlock/kubectl-buildlock: a
# shell and the usual tools for the CI steps that run in it (the GitLab
# component, the Tekton Task). ko builds the image (.ko.yaml; make reads
# this line); the line is a Dockerfile of its own so that Dependabot keeps
# its digest current.
FROM docker.io/library/busybox:1.37.0-musl@sha256:5cec3fc171c87218698e85a52af7087de727372aae264a787b8112901a5b0092
