#!/usr/bin/env bash
# Starts and stops the throwaway PostgreSQL, Apache Kafka and schema registry
# (Apicurio Registry, Confluent-compatible API) that the tests, benchmarks and
# `make demo --kafka=local` use. Everything runs on loopback and
# lives outside the work tree.
#
#   scripts/services.sh up [pg|kafka|registry|all]   start (or reuse) the services; prints env lines
#   scripts/services.sh down                stop what this script started
#   scripts/services.sh env                 print the env lines of running services
#   scripts/services.sh status              one line per service
#   scripts/services.sh classpath           resolve (first run only) and print the Kafka jars' classpath
#   scripts/services.sh kafka-config P C    write the shared broker's configuration into $ONCEFLOW_RUN_DIR/kafka
#                                           (from internal/kafkanode's templates), start nothing
#
# ONCEFLOW_TEST_DATABASE_URL / ONCEFLOW_TEST_KAFKA_BROKERS /
# ONCEFLOW_TEST_SCHEMA_REGISTRY_URL, when set, name external services: then
# nothing is started for that service.
#
# ONCEFLOW_PG_FSYNC=on|off sets the throwaway PostgreSQL's fsync, also on a
# cluster already running (a reload; unset leaves it as it is, on for a new
# cluster). `make test` asks for off: every test database is dropped at the
# end of its test and each DROP DATABASE forces a checkpoint, which with
# fsync on waits for the disk (hundreds of them per run). No test cuts the
# machine's power, the one failure fsync protects against; crash tests kill
# processes, and a commit's WAL is still written before it returns
# (synchronous_commit stays on). `make bench` asks for on.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache_dir=${ONCEFLOW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/onceflow}
# PostgreSQL runs as an unprivileged user who may not enter $HOME, so its
# state lives under /tmp (or $TMPDIR).
run_dir=${ONCEFLOW_RUN_DIR:-${TMPDIR:-/tmp}/onceflow-$(id -u)}
pg_dir=$run_dir/pg
kafka_dir=$run_dir/kafka
registry_dir=$run_dir/registry
# Tool overrides (also used by the tests of this script's error messages).
java_bin=${ONCEFLOW_JAVA:-java}
mvn_bin=${ONCEFLOW_MVN:-mvn}
kcat_bin=${ONCEFLOW_KCAT:-kcat}
pg_glob=${ONCEFLOW_PG_BINDIR:-/usr/lib/postgresql/*/bin}
kafka_lib=$cache_dir/kafka-lib-$(sha256sum "$repo/tools/kafka/pom.xml" | cut -c1-12)
registry_lib=$cache_dir/apicurio-$(sha256sum "$repo/tools/apicurio/pom.xml" | cut -c1-12)

die() { echo "services: $*" >&2; exit 1; }
log() { echo "services: $*" >&2; }

need() { # need TOOL NAME PACKAGE
  command -v "$1" >/dev/null 2>&1 || die "$2 not found: install the Debian package '$3' (apt-get install -y $3)"
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

free_port() { # free_port START
  local p=$1
  for _ in $(seq 1 50); do
    if ! port_busy "$p"; then echo "$p"; return 0; fi
    p=$((p + 1))
  done
  die "no free loopback port near $1"
}

with_lock() { # serialise concurrent `up` calls (parallel test packages)
  mkdir -p "$run_dir"
  exec 9>"$run_dir/lock"
  flock -w 300 9 || die "timed out waiting for $run_dir/lock"
}

# ---------------------------------------------------------------- PostgreSQL

pg_bin() {
  local d
  for d in $(ls -d $pg_glob 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  done
  [ -z "${ONCEFLOW_PG_BINDIR:-}" ] && command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  die "initdb not found: install the Debian package 'postgresql' (apt-get install -y postgresql)"
}

as_pg() { # run a command as the unprivileged PostgreSQL user when we are root
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_url() { echo "postgres://postgres@127.0.0.1:$(cat "$pg_dir/port")/postgres?sslmode=disable"; }

pg_running() {
  [ -f "$pg_dir/port" ] && [ -d "$pg_dir/data" ] || return 1
  "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$(cat "$pg_dir/port")" -t 2
}

# pg_fsync_mode prints ONCEFLOW_PG_FSYNC (on, off or empty) or dies on
# another value.
pg_fsync_mode() {
  case "${ONCEFLOW_PG_FSYNC:-}" in
    ""|on|off) echo "${ONCEFLOW_PG_FSYNC:-}" ;;
    *) die "ONCEFLOW_PG_FSYNC=${ONCEFLOW_PG_FSYNC}: want on or off" ;;
  esac
}

# pg_set_fsync MODE: a running cluster's fsync, changed by a reload when it
# differs.
pg_set_fsync() {
  local url now; url=$(pg_url)
  now=$("$(pg_bin)/psql" -XAtq "$url" -c 'SHOW fsync') || die "cannot read fsync of the running postgres: see $pg_dir/postgres.log"
  [ "$now" = "$1" ] && return 0
  "$(pg_bin)/psql" -XAtq "$url" -c "ALTER SYSTEM SET fsync = '$1'" -c 'SELECT pg_reload_conf()' >/dev/null \
    || die "cannot set fsync = $1 on the running postgres"
  log "postgres fsync: $now -> $1"
}

pg_up() {
  if [ -n "${ONCEFLOW_TEST_DATABASE_URL:-}" ]; then echo "ONCEFLOW_TEST_DATABASE_URL=$ONCEFLOW_TEST_DATABASE_URL"; return; fi
  local bin fsync; bin=$(pg_bin); fsync=$(pg_fsync_mode)
  if pg_running; then
    log "postgres already running on port $(cat "$pg_dir/port") (log: $pg_dir/postgres.log)"
    [ -z "$fsync" ] || pg_set_fsync "$fsync"
    echo "ONCEFLOW_TEST_DATABASE_URL=$(pg_url)"; return
  fi
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "user 'postgres' not found: install the Debian package 'postgresql' (it creates the user) or run as a non-root user"
  fi
  mkdir -p "$pg_dir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$run_dir" "$pg_dir" 2>/dev/null || true; chmod 755 "$run_dir"; fi
  # A stale cluster (left by a killed run) is stopped and replaced.
  if [ -f "$pg_dir/data/postmaster.pid" ]; then as_pg "$bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true; fi
  rm -rf "$pg_dir/data"
  local port; port=$(free_port "${ONCEFLOW_PG_PORT:-55432}")
  as_pg "$bin/initdb" -D "$pg_dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$pg_dir/initdb.log" 2>&1 \
    || die "initdb failed: see $pg_dir/initdb.log"
  cat >>"$pg_dir/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$pg_dir'
max_connections = 400
shared_buffers = 256MB
max_locks_per_transaction = 256
fsync = ${fsync:-on}
log_min_messages = warning
log_line_prefix = '%m [%p] %d '
CONF
  echo "$port" >"$pg_dir/port"
  as_pg "$bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/postgres.log" -w -t 60 start >/dev/null 9>&- \
    || die "postgres failed to start: see $pg_dir/postgres.log"
  for _ in $(seq 1 60); do pg_running && break; sleep 0.5; done
  pg_running || die "postgres did not answer pg_isready on port $port: see $pg_dir/postgres.log"
  log "postgres $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, fsync ${fsync:-on} (log: $pg_dir/postgres.log)"
  echo "ONCEFLOW_TEST_DATABASE_URL=$(pg_url)"
}

pg_down() {
  [ -d "$pg_dir/data" ] || return 0
  local pid=""
  [ -f "$pg_dir/data/postmaster.pid" ] && pid=$(head -n1 "$pg_dir/data/postmaster.pid")
  as_pg "$(pg_bin)/pg_ctl" -D "$pg_dir/data" -m fast -w -t 30 stop >/dev/null 2>&1 \
    || as_pg "$(pg_bin)/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
  # pg_ctl returns once the pid file is gone; wait for the process itself.
  if [ -n "$pid" ]; then
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$pg_dir"
  log "postgres stopped"
}

# ---------------------------------------------------------------- Kafka

kafka_classpath() {
  if [ ! -f "$kafka_lib/.complete" ]; then
    need "$mvn_bin" mvn maven
    log "resolving Apache Kafka jars with mvn into $kafka_lib (first run only)"
    rm -rf "$kafka_lib"
    (cd "$repo/tools/kafka" && "$mvn_bin" -B -q dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$kafka_lib" >"$run_dir/mvn.log" 2>&1) || die "mvn could not resolve the Kafka jars: see $run_dir/mvn.log"
    touch "$kafka_lib/.complete"
  fi
  echo "$kafka_lib/*"
}

kafka_brokers() { echo "127.0.0.1:$(cat "$kafka_dir/port")"; }

kafka_answers() { # a metadata request through an independent client
  "$kcat_bin" -b "$1" -L -m 5 >/dev/null 2>&1
}

kafka_running() {
  [ -f "$kafka_dir/pid" ] && [ -f "$kafka_dir/port" ] || return 1
  kill -0 "$(cat "$kafka_dir/pid")" 2>/dev/null || return 1
  kafka_answers "$(kafka_brokers)"
}

# render FILE KEY=VALUE...: FILE with each ${KEY} replaced by VALUE, the
# rule of internal/kafkanode's Go; a placeholder left without a value is an
# error.
render() {
  local file=$1 t kv; shift
  t=$(<"$file")
  for kv in "$@"; do t=${t//"\${${kv%%=*}}"/"${kv#*=}"}; done
  case $t in *'${'*) die "render $file: a placeholder has no value" ;; esac
  printf '%s\n' "$t"
}

# kafka_config PORT CPORT: write the shared broker's server.properties and
# log4j2.properties into $kafka_dir, from the templates the Go launcher
# (internal/kafkanode) uses too.
kafka_config() {
  local port=$1 cport=$2 tpl=$repo/internal/kafkanode
  mkdir -p "$kafka_dir"
  { printf '%s\n' "listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport" \
      "advertised.listeners=PLAINTEXT://127.0.0.1:$port" \
      "inter.broker.listener.name=PLAINTEXT" \
      "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    render "$tpl/broker.properties" NODE_ID=1 "QUORUM_VOTERS=1@127.0.0.1:$cport" "LOG_DIRS=$kafka_dir/data" \
      REPLICATION_FACTOR=1 MIN_ISR=1
  } >"$kafka_dir/server.properties"
  render "$tpl/log4j2.properties" "LOG_FILE=$kafka_dir/server.log" >"$kafka_dir/log4j2.properties"
}

kafka_up() {
  if [ -n "${ONCEFLOW_TEST_KAFKA_BROKERS:-}" ]; then echo "ONCEFLOW_TEST_KAFKA_BROKERS=$ONCEFLOW_TEST_KAFKA_BROKERS"; return; fi
  need "$java_bin" java openjdk-17-jre-headless
  need "$kcat_bin" kcat kcat
  if kafka_running; then
    log "kafka already running on $(kafka_brokers) (log: $kafka_dir/server.log)"
    echo "ONCEFLOW_TEST_KAFKA_BROKERS=$(kafka_brokers)"; return
  fi
  [ -f "$kafka_dir/pid" ] && kill -9 "$(cat "$kafka_dir/pid")" 2>/dev/null || true
  rm -rf "$kafka_dir"; mkdir -p "$kafka_dir"
  local cp; cp=$(kafka_classpath)
  local port cport
  port=$(free_port "${ONCEFLOW_KAFKA_PORT:-59092}")
  cport=$(free_port $((port + 100)))
  kafka_config "$port" "$cport"
  local jvm=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
    -Dlog4j2.configurationFile="$kafka_dir/log4j2.properties" -cp "$cp")
  local cluster_id; cluster_id=$("$java_bin" "${jvm[@]}" kafka.tools.StorageTool random-uuid 2>>"$kafka_dir/format.log" | tail -n1)
  "$java_bin" "${jvm[@]}" kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$kafka_dir/server.properties" \
    >>"$kafka_dir/format.log" 2>&1 || die "kafka storage format failed: see $kafka_dir/format.log"
  echo "$port" >"$kafka_dir/port"
  nohup "$java_bin" "${jvm[@]}" kafka.Kafka "$kafka_dir/server.properties" >"$kafka_dir/stdout.log" 2>&1 </dev/null 9>&- &
  echo $! >"$kafka_dir/pid"
  for _ in $(seq 1 120); do
    kill -0 "$(cat "$kafka_dir/pid")" 2>/dev/null || die "kafka exited during start: see $kafka_dir/stdout.log and $kafka_dir/server.log"
    kafka_answers "$(kafka_brokers)" && break
    sleep 0.5
  done
  kafka_answers "$(kafka_brokers)" || die "kafka did not answer a metadata request on $(kafka_brokers): see $kafka_dir/server.log"
  log "kafka $(basename "$kafka_lib"/kafka_2.13-*.jar .jar | sed 's/kafka_2.13-//') on $(kafka_brokers) (log: $kafka_dir/server.log)"
  echo "ONCEFLOW_TEST_KAFKA_BROKERS=$(kafka_brokers)"
}

kafka_down() {
  [ -f "$kafka_dir/pid" ] || { rm -rf "$kafka_dir"; return 0; }
  local pid; pid=$(cat "$kafka_dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$kafka_dir"
  log "kafka stopped"
}

# ---------------------------------------------------------------- schema registry
# Apicurio Registry with in-memory storage; tests use its Confluent-compatible
# API, so the env line names .../apis/ccompat/v7. Its default compatibility is
# NONE; it is set to BACKWARD (what Confluent's registry defaults to) at start.

registry_server() {
  if [ ! -f "$registry_lib/.complete" ]; then
    need "$mvn_bin" mvn maven
    log "resolving Apicurio Registry with mvn into $registry_lib (first run only)"
    rm -rf "$registry_lib"
    (cd "$repo/tools/apicurio" && "$mvn_bin" -B -q dependency:unpack -Dregistry.dir="$registry_lib" \
      >"$run_dir/mvn-registry.log" 2>&1) || die "mvn could not resolve Apicurio Registry: see $run_dir/mvn-registry.log"
    rm -rf "$repo/tools/apicurio/target"
    touch "$registry_lib/.complete"
  fi
  local jar; jar=$(ls "$registry_lib"/apicurio-registry-app-*-runner.jar 2>/dev/null | head -n1)
  [ -n "$jar" ] || die "no apicurio-registry-app-*-runner.jar in $registry_lib (remove it to resolve again)"
  echo "$jar"
}

registry_url() { echo "http://127.0.0.1:$(cat "$registry_dir/port")/apis/ccompat/v7"; }

registry_answers() { curl -sf -m 2 "$1/config" >/dev/null 2>&1; }

registry_running() {
  [ -f "$registry_dir/pid" ] && [ -f "$registry_dir/port" ] || return 1
  kill -0 "$(cat "$registry_dir/pid")" 2>/dev/null || return 1
  registry_answers "$(registry_url)"
}

registry_up() {
  if [ -n "${ONCEFLOW_TEST_SCHEMA_REGISTRY_URL:-}" ]; then echo "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL=$ONCEFLOW_TEST_SCHEMA_REGISTRY_URL"; return; fi
  need "$java_bin" java openjdk-17-jre-headless
  need curl curl curl
  if registry_running; then
    log "schema registry already running at $(registry_url) (log: $registry_dir/registry.log)"
    echo "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL=$(registry_url)"; return
  fi
  [ -f "$registry_dir/pid" ] && kill -9 "$(cat "$registry_dir/pid")" 2>/dev/null || true
  rm -rf "$registry_dir"; mkdir -p "$registry_dir"
  local jar; jar=$(registry_server)
  local port mport
  port=$(free_port "${ONCEFLOW_REGISTRY_PORT:-58081}")
  mport=$(free_port $((port + 100)))
  echo "$port" >"$registry_dir/port"
  (cd "$registry_dir" || exit 1; nohup "$java_bin" -Xms64m -Xmx384m -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport" \
    -jar "$jar" >"$registry_dir/registry.log" 2>&1 </dev/null 9>&- & echo $! >"$registry_dir/pid")
  for _ in $(seq 1 120); do
    kill -0 "$(cat "$registry_dir/pid")" 2>/dev/null || die "schema registry exited during start: see $registry_dir/registry.log"
    registry_answers "$(registry_url)" && break
    sleep 0.5
  done
  registry_answers "$(registry_url)" || die "schema registry did not answer on $(registry_url): see $registry_dir/registry.log"
  curl -sf -m 5 -X PUT -H 'Content-Type: application/json' -d '{"compatibility":"BACKWARD"}' "$(registry_url)/config" >/dev/null \
    || die "could not set the schema registry's global compatibility: see $registry_dir/registry.log"
  log "schema registry $(basename "$jar" -runner.jar | sed 's/apicurio-registry-app-/apicurio /') at $(registry_url) (log: $registry_dir/registry.log)"
  echo "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL=$(registry_url)"
}

registry_down() {
  [ -f "$registry_dir/pid" ] || { rm -rf "$registry_dir"; return 0; }
  local pid; pid=$(cat "$registry_dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$registry_dir"
  log "schema registry stopped"
}

# ---------------------------------------------------------------- main

cmd=${1:-}
what=${2:-all}
case "$cmd" in
  up)
    with_lock
    case "$what" in
      pg) pg_up ;;
      kafka) kafka_up ;;
      registry) registry_up ;;
      all) pg_up; kafka_up; registry_up ;;
      *) die "unknown service '$what' (want pg, kafka, registry or all)" ;;
    esac ;;
  down)
    with_lock
    registry_down; kafka_down; pg_down ;;
  env)
    if [ -n "${ONCEFLOW_TEST_DATABASE_URL:-}" ]; then echo "ONCEFLOW_TEST_DATABASE_URL=$ONCEFLOW_TEST_DATABASE_URL"
    elif pg_running; then echo "ONCEFLOW_TEST_DATABASE_URL=$(pg_url)"; fi
    if [ -n "${ONCEFLOW_TEST_KAFKA_BROKERS:-}" ]; then echo "ONCEFLOW_TEST_KAFKA_BROKERS=$ONCEFLOW_TEST_KAFKA_BROKERS"
    elif kafka_running; then echo "ONCEFLOW_TEST_KAFKA_BROKERS=$(kafka_brokers)"; fi
    if [ -n "${ONCEFLOW_TEST_SCHEMA_REGISTRY_URL:-}" ]; then echo "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL=$ONCEFLOW_TEST_SCHEMA_REGISTRY_URL"
    elif registry_running; then echo "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL=$(registry_url)"; fi ;;
  status)
    if pg_running; then echo "postgres: running on 127.0.0.1:$(cat "$pg_dir/port")"; else echo "postgres: stopped"; fi
    if kafka_running; then echo "kafka: running on $(kafka_brokers)"; else echo "kafka: stopped"; fi
    if registry_running; then echo "registry: running at $(registry_url)"; else echo "registry: stopped"; fi ;;
  kafka-config)
    # Writes the shared broker's configuration without starting it (the
    # kafkanode test compares it with the Go launcher's).
    kafka_config "${2:?usage: services.sh kafka-config PORT CONTROLLER-PORT}" "${3:?usage: services.sh kafka-config PORT CONTROLLER-PORT}" ;;
  classpath)
    # For tests that start their own private broker (internal/testkit/securekafka.go).
    # The lock is only needed while the jars are resolved.
    [ -f "$kafka_lib/.complete" ] || with_lock
    kafka_classpath ;;
  *) die "usage: services.sh up [pg|kafka|registry|all] | down | env | status | classpath | kafka-config PORT CPORT" ;;
esac
