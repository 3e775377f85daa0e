#!/usr/bin/env bash
# Writes the files of the onceflow image other than the two binaries into
# DEST: the users (root, nobody, and nonroot, uid/gid 65532, whom the image
# runs as), the CA bundle from Debian's ca-certificates, nsswitch.conf and a
# world-writable /tmp. scripts/image.sh (`make image`) and the Dockerfile
# both call it, so both images carry the same files.
#
#   scripts/image-rootfs.sh DEST
set -euo pipefail
dest=${1:?usage: image-rootfs.sh DEST}
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || { echo "image-rootfs: no CA bundle at $ca: install the Debian package 'ca-certificates'" >&2; exit 1; }

install -d -m 0755 "$dest" "$dest/etc" "$dest/etc/ssl" "$dest/etc/ssl/certs" "$dest/usr" "$dest/usr/local" "$dest/usr/local/bin"
install -d -m 1777 "$dest/tmp"
install -m 0644 "$ca" "$dest/etc/ssl/certs/ca-certificates.crt"
# No login shell exists in the image; nobody has a home directory.
cat >"$dest/etc/passwd" <<'PASSWD'
root:x:0:0:root:/nonexistent:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
PASSWD
cat >"$dest/etc/group" <<'GROUP'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
GROUP
echo 'hosts: files dns' >"$dest/etc/nsswitch.conf"
chmod 0644 "$dest/etc/passwd" "$dest/etc/group" "$dest/etc/nsswitch.conf"
