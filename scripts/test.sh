#!/usr/bin/env bash
# `make test`: the Go tests of every module (-race, against the services
# named by ONCEFLOW_TEST_*) and, beside them, the Python package's checks
# (scripts/test-python.sh). The Python suite spends most of its time waiting
# on subprocesses and PostgreSQL, so it runs while the Go tests run rather
# than after them; its output is printed when both are done. Exits non-zero
# if either fails, and ends with each part's wall time and how busy the CPUs
# were (a suite near 100 % gains nothing from more parallelism).
#
#   GO, PKGS, TEST_TIMEOUT   as in the Makefile
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
go_cmd=${GO:-go}
read -r -a pkgs <<<"${PKGS:-./... ./cmd/demo/... ./deploy/k8s/...}"
timeout=${TEST_TIMEOUT:-14m}

# cpu_ticks prints the busy and total jiffies of all CPUs since boot.
cpu_ticks() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $((user + nice + system + idle + iowait + irq + softirq + steal))"
}

# kill_tree PID: PID and every process below it.
kill_tree() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null || true
}

pylog=$(mktemp "${TMPDIR:-/tmp}/onceflow-test-python.XXXXXX")
py_pid=
trap '[ -z "$py_pid" ] || kill_tree "$py_pid"; rm -f "$pylog"' EXIT
trap 'exit 130' INT TERM
read -r busy0 total0 < <(cpu_ticks)
start=$(date +%s)

(
  py_start=$(date +%s)
  rc=0
  scripts/test-python.sh >"$pylog" 2>&1 || rc=$?
  echo "python: exit $rc after $(( $(date +%s) - py_start )) s" >>"$pylog"
  exit "$rc"
) &
py_pid=$!

go_rc=0
"$go_cmd" test -race -count=1 -timeout "$timeout" "${pkgs[@]}" || go_rc=$?
go_took=$(( $(date +%s) - start ))

py_rc=0
wait "$py_pid" || py_rc=$?
read -r busy1 total1 < <(cpu_ticks)

echo "--- python (scripts/test-python.sh: mypy --strict, pytest), run beside the Go tests"
cat "$pylog"
echo "--- make test: go exit $go_rc after ${go_took} s; python exit $py_rc; wall $(( $(date +%s) - start )) s; CPUs $(nproc), busy $(( 100 * (busy1 - busy0) / (total1 - total0 > 0 ? total1 - total0 : 1) )) %"
[ "$go_rc" -eq 0 ] && [ "$py_rc" -eq 0 ]
