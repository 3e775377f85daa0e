#!/usr/bin/env bash
# Creates (or reuses) a small virtual environment with the third-party
# clients the wire-format tests read onceflow's topics with (Confluent's
# confluent-kafka with its schema-registry deserializers, the CloudEvents
# SDK: itest/testdata/wire/requirements.txt), and prints its directory. It
# lives outside the work tree, keyed by a hash of the requirements, so a
# second run reuses it. ONCEFLOW_PYTHON3 names the interpreter (default python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${ONCEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow}
python3_bin=${ONCEFLOW_PYTHON3:-python3}
reqs=$repo/itest/testdata/wire/requirements.txt

die() { echo "python-wire-venv: $*" >&2; exit 1; }

command -v "$python3_bin" >/dev/null 2>&1 || die "$python3_bin not found: install the Debian package 'python3' (3.10 or newer)"
"$python3_bin" -c 'import venv, ensurepip' 2>/dev/null ||
  die "$python3_bin cannot create virtual environments: install the Debian package 'python3-venv'"

key=$( { cat "$reqs"; "$python3_bin" --version; } | sha256sum | cut -c1-16)
venv=$cache_dir/pywire-$key
mkdir -p "$cache_dir"
exec 9>"$venv.lock"
flock -w 900 9 || die "timed out waiting for $venv.lock"
if [ ! -f "$venv/.onceflow-ready" ]; then
  rm -rf "$venv"
  echo "python-wire-venv: creating $venv (first run: installs from the package index)" >&2
  "$python3_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs" >&2 ||
    { rm -rf "$venv"; die "pip install of $reqs failed (see above)"; }
  touch "$venv/.onceflow-ready"
fi
echo "$venv"
