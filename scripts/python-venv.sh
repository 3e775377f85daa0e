#!/usr/bin/env bash
# Creates (or reuses) the virtual environment of the Python package (python/)
# with its test extras, and prints its directory. It lives outside the work
# tree, keyed by a hash of python/pyproject.toml, python/constraints.txt and
# this tree's path (the package is installed editable from this tree), so a
# second run reuses it:
#
#   venv=$(scripts/python-venv.sh) && "$venv/bin/python" -m pytest python/tests
#
# ONCEFLOW_PYTHON3 names the interpreter to build it with (default python3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${ONCEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow}
python3_bin=${ONCEFLOW_PYTHON3:-python3}

die() { echo "python-venv: $*" >&2; exit 1; }

command -v "$python3_bin" >/dev/null 2>&1 || die "$python3_bin not found: install the Debian package 'python3' (3.10 or newer)"
"$python3_bin" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
  die "$("$python3_bin" --version 2>&1) is too old: the package needs Python 3.10 or newer"
"$python3_bin" -c 'import venv, ensurepip' 2>/dev/null ||
  die "$python3_bin cannot create virtual environments: install the Debian package 'python3-venv'"

key=$( { cat "$repo/python/pyproject.toml" "$repo/python/constraints.txt"; echo "$repo"; "$python3_bin" --version; } | sha256sum | cut -c1-16)
venv=$cache_dir/pyvenv-$key
mkdir -p "$cache_dir"
exec 9>"$venv.lock"
flock -w 900 9 || die "timed out waiting for $venv.lock"
if [ ! -f "$venv/.onceflow-ready" ]; then
  rm -rf "$venv"
  echo "python-venv: creating $venv (first run: installs the test dependencies from the package index)" >&2
  "$python3_bin" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$repo/python/constraints.txt" -e "$repo/python[test]" >&2 ||
    { rm -rf "$venv"; die "pip install of python[test] failed (see above)"; }
  touch "$venv/.onceflow-ready"
fi
echo "$venv"
