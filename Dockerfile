# syntax=docker/dockerfile:1
# The buildlock manager image: a static Go binary on distroless static:nonroot
# (no shell, no package manager, uid/gid 65532). Build with `make docker-build`.
# Releases build the same image without Docker, with ko (.ko.yaml, `make
# release-images`), on this file's final base (pinned by digest, which
# Dependabot keeps current) and with this file's build flags.
#
# test/chart/dockerfile_test.go builds the manager with this file's `go build`
# line and checks the result is static, so keep that command on one RUN line;
# test/release checks that ko builds with the same flags on the same base.

# The builder runs on the build machine's platform and cross-compiles for the
# target's (docker buildx sets TARGETOS and TARGETARCH).
FROM --platform=$BUILDPLATFORM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH
WORKDIR /workspace

# Dependencies first, so that a source change reuses the module layer.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download

COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/

RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags="-s -w" -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static:nonroot@sha256:e2e927ec666bae08560abb3c55d0659eceabb657f56b6782ab500a9fc7f555e3
WORKDIR /
COPY --from=builder /out/manager /manager
USER 65532:65532
LABEL org.opencontainers.image.title="buildlock" org.opencontainers.image.source="https://github.com/buildlock/buildlock" org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["/manager"]
