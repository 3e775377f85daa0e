# syntax=docker/dockerfile:1
#
# One image carries both onceflow binaries:
#
#   /usr/local/bin/relay     relay run | relay migrate
#   /usr/local/bin/consumer  consumer run | consumer migrate | consumer dlq … | consumer gaps …
#
# The Kubernetes manifests (deploy/k8s) pick the binary with `command:` and
# the subcommand with `args:`; there is no ENTRYPOINT, so
# `docker run IMAGE consumer run …` works as well (PATH has /usr/local/bin).
#
# Build:  docker build -t onceflow:dev .
# The result is static (CGO_ENABLED=0), runs as the distroless "nonroot" user
# (uid/gid 65532) and needs no writable root filesystem.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOOS=linux GOFLAGS=-trimpath
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -ldflags="-s -w" -o /out/relay ./cmd/relay \
 && go build -ldflags="-s -w" -o /out/consumer ./cmd/consumer

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/relay /usr/local/bin/relay
COPY --from=build /out/consumer /usr/local/bin/consumer
USER 65532:65532
EXPOSE 9090
CMD ["/usr/local/bin/relay", "-help"]
