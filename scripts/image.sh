#!/usr/bin/env bash
# Builds the onceflow container image without a Docker daemon and without
# pulling anything from a registry: static binaries (CGO_ENABLED=0), the files
# of scripts/image-rootfs.sh, and buildah from `scratch`, committed as an OCI
# archive. The Dockerfile describes the same image for Docker users
# (deploy/k8s/image_test.go checks that they agree).
#
#   scripts/image.sh [OUTPUT]     default: bin/onceflow-image.oci.tar
#
# Labels: VERSION (default `git describe`), REVISION (the commit) and
# SOURCE_DATE_EPOCH (the commit's time; also the layer's file times), so the
# same commit gives the same image digest.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
out=${1:-bin/onceflow-image.oci.tar}
case "$out" in /*) ;; *) out=$repo/$out ;; esac
command -v buildah >/dev/null 2>&1 || { echo "image: buildah not found: run scripts/require.sh image (as root it installs the Debian package 'buildah')" >&2; exit 1; }

version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
revision=${REVISION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

work=$(mktemp -d "${TMPDIR:-/tmp}/onceflow-image-XXXXXX")
# A private, throwaway storage: vfs needs no overlay support or FUSE, and
# nothing is shared with other builds or with the machine's own images.
bh=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
ctr=
cleanup() {
  [ -n "$ctr" ] && "${bh[@]}" rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

rootfs=$work/rootfs
scripts/image-rootfs.sh "$rootfs"
CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o "$rootfs/usr/local/bin/" ./cmd/relay ./cmd/consumer
chmod 0755 "$rootfs/usr/local/bin/relay" "$rootfs/usr/local/bin/consumer"
find "$rootfs" -exec touch -h -d "@$epoch" {} +

ctr=$("${bh[@]}" from --quiet scratch)
"${bh[@]}" copy --quiet --chown 0:0 "$ctr" "$rootfs/" / >/dev/null
"${bh[@]}" config \
  --user 65532:65532 \
  --env PATH=/usr/local/bin \
  --workingdir / \
  --port 9090/tcp \
  --port 9091/tcp \
  --cmd '["/usr/local/bin/relay", "-help"]' \
  --created-by "scripts/image.sh" \
  --label org.opencontainers.image.title=onceflow \
  --label "org.opencontainers.image.description=relay and consumer: PostgreSQL outbox to Kafka to PostgreSQL inbox, observationally exactly-once" \
  --label org.opencontainers.image.source=https://github.com/onceflow/onceflow \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.created=$created" \
  "$ctr"
mkdir -p "$(dirname "$out")"
"${bh[@]}" commit --quiet --timestamp "$epoch" --identity-label=false --disable-compression=false \
  "$ctr" "oci-archive:$out.partial" >/dev/null
mv "$out.partial" "$out"
digest=$(tar -xOf "$out" index.json | grep -o 'sha256:[0-9a-f]*' | head -n1)
echo "image: $out ($(du -h "$out" | cut -f1), manifest $digest, version $version)" >&2
