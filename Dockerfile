# syntax=docker/dockerfile:1
#
# One image carries both onceflow binaries:
#
#   /usr/local/bin/relay     relay run | relay migrate
#   /usr/local/bin/consumer  consumer run | consumer migrate | consumer dlq … | consumer gaps …
#
# The Kubernetes manifests (deploy/k8s) pick the binary with `command:` and
# the subcommand with `args:`; there is no ENTRYPOINT, so
# `docker run IMAGE consumer run …` works as well (PATH is /usr/local/bin).
#
# Build:  docker build -t onceflow:dev .
# Without Docker: `make image` (scripts/image.sh) builds the same image with
# buildah into an OCI archive; deploy/k8s/image_test.go checks that the two
# agree (user, files, labels, command). The result is static
# (CGO_ENABLED=0), built from scratch with no shell, runs as the non-root
# user "nonroot" (uid/gid 65532) and needs no writable root filesystem.

ARG GO_VERSION=1.26

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOOS=linux GOFLAGS=-trimpath GOWORK=off
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN scripts/image-rootfs.sh /rootfs \
 && go build -ldflags="-s -w" -o /out/relay ./cmd/relay \
 && go build -ldflags="-s -w" -o /out/consumer ./cmd/consumer

FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
COPY --from=build /rootfs/ /
COPY --from=build /out/relay /usr/local/bin/relay
COPY --from=build /out/consumer /usr/local/bin/consumer
ENV PATH=/usr/local/bin
WORKDIR /
USER 65532:65532
EXPOSE 9090 9091
LABEL org.opencontainers.image.title="onceflow" \
      org.opencontainers.image.description="relay and consumer: PostgreSQL outbox to Kafka to PostgreSQL inbox, observationally exactly-once" \
      org.opencontainers.image.source="https://github.com/onceflow/onceflow" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"
CMD ["/usr/local/bin/relay", "-help"]
