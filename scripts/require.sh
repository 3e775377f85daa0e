#!/usr/bin/env bash
# Installs the Debian packages that a make target needs and this machine lacks.
#
#   scripts/require.sh GROUP…           what the groups in the table below need
#   scripts/require.sh CHECK=PACKAGE…   ad hoc, e.g. scripts/require.sh chromium=chromium
#
# Nothing missing: silent, exit 0. Something missing, running as root: one
# `apt-get update` and one `apt-get install` for all of it, then every check
# again. Not root: one line naming the exact command to run, exit 1.
#
# ONCEFLOW_APT_GET replaces apt-get (the tests of this script use a fake).
set -euo pipefail

groups=() checks=() packages=()
need() { # need GROUP… CHECK PACKAGE
  local n=$# all=("$@")
  groups+=(" ${all[*]:0:n-2} ") checks+=("${all[n-2]}") packages+=("${all[n-1]}")
}

# ---------------------------------------------------------------- requirements
# One line per requirement: need GROUP… CHECK PACKAGE.
#   CHECK    a command on PATH; an absolute path (a glob is fine, quoted); or
#            a shell condition (any CHECK with a space in it, quoted)
#   PACKAGE  the Debian package that provides it
# The Makefile asks for: test → postgres kafka test; test-python → postgres
# python; bench, services-up → postgres kafka; demo → postgres (and kafka
# with KAFKA=local); image → image; soak → postgres kafka.

need postgres   '/usr/lib/postgresql/*/bin/initdb'    postgresql
need kafka      java                                  openjdk-17-jre-headless
need kafka      mvn                                   maven
need kafka      kcat                                  kcat
need kafka      curl                                  curl
need test       promtool                              prometheus
need test image buildah                               buildah
need test image /etc/ssl/certs/ca-certificates.crt    ca-certificates
need test       podman                                podman
need test       runc                                  runc
need test       chromium                              chromium
need test python 'python3 -c "import venv, ensurepip"' python3-venv

# ---------------------------------------------------------------- main

die() { echo "require: $*" >&2; exit 1; }

present() { # present CHECK
  case "$1" in
    *' '*) bash -c "$1" >/dev/null 2>&1 ;;
    /*) compgen -G "$1" >/dev/null ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

[ $# -gt 0 ] || die "usage: require.sh GROUP… | CHECK=PACKAGE… (groups: $(printf '%s\n' "${groups[@]}" | tr ' ' '\n' | sort -u | xargs))"

# The requirements asked for, in table order, then the ad hoc ones.
want_checks=() want_packages=()
for arg in "$@"; do
  case "$arg" in
    *=*) continue ;;
  esac
  case " ${groups[*]} " in
    *" $arg "*) ;;
    *) die "unknown group '$arg' (groups: $(printf '%s\n' "${groups[@]}" | tr ' ' '\n' | sort -u | xargs))" ;;
  esac
done
for i in "${!checks[@]}"; do
  for arg in "$@"; do
    if [[ "$arg" != *=* && "${groups[i]}" == *" $arg "* ]]; then
      want_checks+=("${checks[i]}") want_packages+=("${packages[i]}")
      break
    fi
  done
done
for arg in "$@"; do
  if [[ "$arg" == *=* ]]; then
    want_checks+=("${arg%=*}") want_packages+=("${arg##*=}")
  fi
done

missing() { # prints "CHECK<TAB>PACKAGE" for each requirement not met
  local i
  for i in "${!want_checks[@]}"; do
    present "${want_checks[i]}" || printf '%s\t%s\n' "${want_checks[i]}" "${want_packages[i]}"
  done
}

lacking=$(missing)
[ -z "$lacking" ] && exit 0

pkgs=$(cut -f2 <<<"$lacking" | awk '!seen[$0]++' | xargs)
what=$(awk -F'\t' '{printf "%s%s", (NR > 1 ? ", " : ""), $1}' <<<"$lacking")
apt=${ONCEFLOW_APT_GET:-apt-get}

if [ "$(id -u)" != 0 ]; then
  if ! command -v "$apt" >/dev/null 2>&1; then
    die "missing $what: install the Debian packages $pkgs (no apt-get on this machine)"
  fi
  install="$apt update && $apt install -y --no-install-recommends $pkgs"
  if command -v sudo >/dev/null 2>&1; then
    die "missing $what; to install: sudo $apt update && sudo $apt install -y --no-install-recommends $pkgs"
  fi
  die "missing $what; to install: su root -c '$install'"
fi

command -v "$apt" >/dev/null 2>&1 || die "missing $what: install the Debian packages $pkgs (no apt-get on this machine)"

# Root: one installer at a time (parallel make targets, other checkouts);
# whoever waited checks again before installing.
lock=${TMPDIR:-/tmp}/onceflow-require.lock
exec 9>"$lock"
flock -w 900 9 || die "timed out waiting for $lock"
lacking=$(missing)
[ -z "$lacking" ] && exit 0
pkgs=$(cut -f2 <<<"$lacking" | awk '!seen[$0]++' | xargs)
what=$(awk -F'\t' '{printf "%s%s", (NR > 1 ? ", " : ""), $1}' <<<"$lacking")

log=${TMPDIR:-/tmp}/onceflow-require-apt.log
echo "require: missing $what; installing the Debian packages $pkgs (log: $log)" >&2
export DEBIAN_FRONTEND=noninteractive
{
  "$apt" -o DPkg::Lock::Timeout=600 update -qq &&
    "$apt" -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends $pkgs
} >"$log" 2>&1 9>&- || die "apt-get failed installing $pkgs; the end of $log:
$(tail -n 15 "$log")"

hash -r
lacking=$(missing)
if [ -n "$lacking" ]; then
  die "still missing after installing $pkgs: $(awk -F'\t' '{printf "%s%s (from %s)", (NR > 1 ? ", " : ""), $1, $2}' <<<"$lacking")"
fi
echo "require: installed $pkgs" >&2
