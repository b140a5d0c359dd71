# pd-sidecar: a static binary (CGO_ENABLED=0) on distroless, non-root.
#   docker build -t ghcr.io/pd-sidecar/pd-sidecar:0.1.0 .
# The tcp KV transport and the dlopen'ed NIXL loader need no cgo; for UCX
# and NIXL transports use Dockerfile.cuda.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" \
        -o /out/pd-sidecar ./cmd/pd-sidecar

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pd-sidecar /pd-sidecar
# Numeric, so Kubernetes can verify runAsNonRoot.
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/pd-sidecar"]
