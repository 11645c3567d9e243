#!/usr/bin/env bash
# scripts/kafka-apache.sh — a single-node Apache Kafka 4.x broker (KRaft, no
# ZooKeeper) built from Maven Central jars, for trace's Kafka integration tests.
#
#   scripts/kafka-apache.sh resolve  # fetch the jars only (skipped if already there)
#   scripts/kafka-apache.sh start    # resolve if needed, format storage, start, wait
#   scripts/kafka-apache.sh status   # exit 0 if running and ready, 3 otherwise
#   scripts/kafka-apache.sh stop     # stop it (no-op if not running)
#
# How: test/infra/kafka/pom.xml lists org.apache.kafka:kafka_2.13 plus the SLF4J
# -> Log4j 2 binding; `mvn dependency:copy-dependencies` copies the runtime jars
# into $TRACE_KAFKA_HOME/lib-<version>/, then
#   java -cp 'lib/*' kafka.tools.StorageTool format -t <id> -c server.properties
#                                                        (fresh data dir each start)
#   java -Xmx512m -Xms256m -cp 'lib/*' kafka.Kafka server.properties
# runs in the background with a pid file and a log file. Ready means the log
# says "Kafka Server started" and the PLAINTEXT port accepts TCP connections.
#
# Nothing is exported; the last line of `start` (and `status`) is
#   KAFKA_BROKERS=127.0.0.1:19092
# so a caller can do: eval "$(scripts/kafka-apache.sh start | tail -n 1)"
#
# Environment (all optional):
#   TRACE_KAFKA_HOME          cache dir (jars, data, logs)  (default /var/cache/trace/kafka)
#   TRACE_KAFKA_VERSION       Kafka version from Maven Central (default 4.4.0)
#   TRACE_KAFKA_PORT/PORT     PLAINTEXT port on 127.0.0.1   (default 19092)
#   TRACE_KAFKA_CONTROLLER_PORT  KRaft controller port       (default PORT+1)
#   TRACE_KAFKA_KEEP_DATA=1   keep the topics of the previous run (default: wiped on start)
#   TRACE_KAFKA_HEAP_OPTS     (default "-Xmx512m -Xms256m")
#   TRACE_KAFKA_START_TIMEOUT seconds to wait for readiness (default 120)
#   TRACE_KAFKA_MAVEN_REPO    local Maven repository (default: Maven's own, ~/.m2/repository)
#   JAVA_HOME                 Java 17+ to use (default: java on PATH)
#   CI=true                   failures print the full log tail and exit non-zero
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/../test/infra/kafka/pom.xml"

KAFKA_VERSION="${TRACE_KAFKA_VERSION:-4.4.0}"
KAFKA_HOME_DIR="${TRACE_KAFKA_HOME:-/var/cache/trace/kafka}"
HOST="127.0.0.1"
PORT="${TRACE_KAFKA_PORT:-${PORT:-19092}}"
CONTROLLER_PORT="${TRACE_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
HEAP_OPTS="${TRACE_KAFKA_HEAP_OPTS:--Xmx512m -Xms256m}"
START_TIMEOUT="${TRACE_KAFKA_START_TIMEOUT:-120}"

LIB_DIR="$KAFKA_HOME_DIR/lib-$KAFKA_VERSION"
STAMP="$LIB_DIR/.trace-resolved"
RUN_DIR="$KAFKA_HOME_DIR/run-$PORT"
DATA_DIR="$RUN_DIR/data"
CONFIG="$RUN_DIR/server.properties"
LOG4J_CONFIG="$RUN_DIR/log4j2.properties"
PID_FILE="$RUN_DIR/kafka.pid"
LOG_FILE="$RUN_DIR/kafka.log"
RESOLVE_LOG="$KAFKA_HOME_DIR/resolve-$KAFKA_VERSION.log"
LOCK_FILE="$KAFKA_HOME_DIR/.lock"

log() { printf '[kafka-apache] %s\n' "$*" >&2; }

DUMP_LOGS=()
die() {
  printf '[kafka-apache] ERROR: %s\n' "$*" >&2
  local f n=40
  [[ "${CI:-}" == "true" ]] && n=200
  for f in "${DUMP_LOGS[@]:-}"; do
    [[ -n "$f" && -s "$f" ]] || continue
    printf '[kafka-apache] ---- last %d lines of %s ----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2 || true
    printf '[kafka-apache] ---- end of %s ----\n' "$f" >&2
  done
  exit 1
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

with_lock() {
  if ! { mkdir -p "$KAFKA_HOME_DIR" 2>/dev/null && [[ -w "$KAFKA_HOME_DIR" ]]; }; then
    die "cannot write to $KAFKA_HOME_DIR (set TRACE_KAFKA_HOME to a writable directory)"
  fi
  exec 9>"$LOCK_FILE"
  flock -w 900 9 || die "could not take the lock $LOCK_FILE within 900 s (another kafka-apache.sh running?)"
}

java_bin() {
  if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
    printf '%s\n' "$JAVA_HOME/bin/java"
  else
    command -v java || die "java not found: Kafka $KAFKA_VERSION needs Java 17+ (apt-get install -y openjdk-17-jre-headless, or set JAVA_HOME)"
  fi
}

check_java() {
  local java; java="$(java_bin)"
  local v
  v="$("$java" -version 2>&1 | awk -F'"' '/version/ { print $2; exit }')"
  local major="${v%%.*}"
  [[ "$major" =~ ^[0-9]+$ ]] || die "cannot tell the Java version of $java ('$v')"
  ((major >= 17)) || die "Kafka $KAFKA_VERSION needs Java 17+, $java is $v (set JAVA_HOME)"
}

classpath() { printf '%s/*\n' "$LIB_DIR"; }

is_resolved() {
  [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$(stamp_text)" ]]
}

stamp_text() {
  printf 'kafka %s pom-sha256 %s\n' "$KAFKA_VERSION" "$(sha256sum "$POM" | cut -d' ' -f1)"
}

# Prints the Kafka version found in the resolved jars (from kafka-clients' name).
jar_version() {
  local j
  for j in "$LIB_DIR"/kafka-clients-*.jar; do
    [[ -e "$j" ]] || continue
    j="${j##*/kafka-clients-}"
    printf '%s\n' "${j%.jar}"
    return 0
  done
  return 1
}

do_resolve() {
  [[ -f "$POM" ]] || die "pom not found: $POM"
  if is_resolved; then
    log "jars already resolved in $LIB_DIR (Kafka $(jar_version || echo "$KAFKA_VERSION")); resolve took 0.0 s"
    echo "KAFKA_RESOLVE_SECONDS=0.0"
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found (apt-get install -y maven)"
  local t0; t0="$(now)"
  mkdir -p "$KAFKA_HOME_DIR"
  local tmp="$LIB_DIR.tmp.$$"
  rm -rf "$tmp"
  local -a mvn_args=(-B -q -f "$POM" "-Dkafka.version=$KAFKA_VERSION")
  [[ -n "${TRACE_KAFKA_MAVEN_REPO:-}" ]] && mvn_args+=("-Dmaven.repo.local=$TRACE_KAFKA_MAVEN_REPO")
  log "resolving org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its runtime jars with Maven (log: $RESOLVE_LOG)"
  DUMP_LOGS=("$RESOLVE_LOG")
  if ! mvn "${mvn_args[@]}" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$tmp" >"$RESOLVE_LOG" 2>&1; then
    rm -rf "$tmp"
    die "mvn dependency:copy-dependencies failed for Kafka $KAFKA_VERSION"
  fi
  [[ -e "$tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] || die "resolved jars lack kafka_2.13-$KAFKA_VERSION.jar ($tmp)"
  rm -rf "$LIB_DIR"
  mv "$tmp" "$LIB_DIR"
  stamp_text >"$STAMP"
  local n; n="$(find "$LIB_DIR" -name '*.jar' | wc -l)"
  log "resolved $n jars into $LIB_DIR in $(elapsed "$t0") s"
  echo "KAFKA_RESOLVE_SECONDS=$(elapsed "$t0")"
}

read_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  printf '%s\n' "$pid"
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

started_in_log() { grep -q 'Kafka Server started' "$LOG_FILE" 2>/dev/null; }

print_env() { echo "KAFKA_BROKERS=$HOST:$PORT"; }

write_config() {
  cat >"$CONFIG" <<EOF
# Written by scripts/kafka-apache.sh: single-node KRaft broker+controller for tests.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA_DIR
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
# Small thread pools: the machine is shared.
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.retention.hours=24
EOF
  cat >"$LOG4J_CONFIG" <<'EOF'
# Written by scripts/kafka-apache.sh: everything to stdout (redirected to kafka.log).
status = warn
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
EOF
}

format_storage() {
  local java; java="$(java_bin)"
  if [[ "${TRACE_KAFKA_KEEP_DATA:-}" == "1" && -f "$DATA_DIR/meta.properties" ]]; then
    log "keeping existing data in $DATA_DIR (TRACE_KAFKA_KEEP_DATA=1)"
    return 0
  fi
  rm -rf "$DATA_DIR"
  mkdir -p "$DATA_DIR"
  # The cluster id is what `kafka.tools.StorageTool random-uuid` prints: 16
  # random bytes, URL-safe base64 without padding, not starting with '-'.
  # Made here to save one JVM start (~2-3 s).
  local cluster_id=""
  while [[ ! "$cluster_id" =~ ^[A-Za-z0-9_][A-Za-z0-9_-]{21}$ ]]; do
    cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
  done
  # -XX:TieredStopAtLevel=1: a short-lived tool starts faster with C1 only.
  "$java" -XX:TieredStopAtLevel=1 -Xshare:auto -cp "$(classpath)" \
    -Dlog4j2.configurationFile="$LOG4J_CONFIG" \
    kafka.tools.StorageTool format -t "$cluster_id" -c "$CONFIG" >>"$LOG_FILE" 2>&1 \
    || die "kafka.tools.StorageTool format failed (log: $LOG_FILE)"
  log "formatted $DATA_DIR (cluster id $cluster_id)"
}

do_start() {
  command -v flock >/dev/null 2>&1 || die "flock not found (apt-get install -y util-linux)"
  with_lock
  local pid
  if pid="$(read_pid)" && port_open "$PORT" && started_in_log; then
    log "already running (pid $pid) on $HOST:$PORT, log $LOG_FILE"
    echo "KAFKA_VERSION=$(sed -n 's/.*Kafka version: \([^ ]*\).*/\1/p' "$LOG_FILE" | head -n 1)"
    print_env
    return 0
  fi
  if [[ -n "${pid:-}" ]]; then
    log "stale broker process $pid (not ready): stopping it"
    do_stop_locked
  fi
  local p
  for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "port $p on $HOST is already taken by another process (set TRACE_KAFKA_PORT or PORT)"
    fi
  done
  check_java
  do_resolve
  log "Kafka version: $(jar_version || echo "?") (requested $KAFKA_VERSION), Java: $("$(java_bin)" -version 2>&1 | head -n 1)"
  echo "KAFKA_VERSION=$(jar_version || echo "$KAFKA_VERSION")"
  local t0; t0="$(now)"
  mkdir -p "$RUN_DIR"
  rm -f "$PID_FILE" # a dead process's pid file would look like a failed start
  : >"$LOG_FILE"
  DUMP_LOGS=("$LOG_FILE")
  write_config
  format_storage
  local java; java="$(java_bin)"
  # shellcheck disable=SC2086 # HEAP_OPTS is a list of JVM flags
  # shellcheck disable=SC2016 # $$, $1 and $@ are expanded by the inner bash
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
    "$java" $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$LOG4J_CONFIG" -Dkafka.logs.dir="$RUN_DIR" \
    -cp "$(classpath)" kafka.Kafka "$CONFIG" \
    </dev/null >>"$LOG_FILE" 2>&1 9>&- &
  local deadline=$((SECONDS + START_TIMEOUT))
  while ! { started_in_log && port_open "$PORT"; }; do
    sleep 0.5
    if [[ -f "$PID_FILE" ]] && ! read_pid >/dev/null; then
      die "the broker exited during start-up (log: $LOG_FILE)"
    fi
    if ((SECONDS >= deadline)); then
      do_stop_locked || true
      die "the broker was not ready within $START_TIMEOUT s (log: $LOG_FILE)"
    fi
  done
  pid="$(read_pid)" || die "broker ready but its pid file is gone"
  local running_version
  running_version="$(sed -n 's/.*Kafka version: \([^ ]*\).*/\1/p' "$LOG_FILE" | head -n 1)"
  log "started Kafka ${running_version:-?} (pid $pid) on $HOST:$PORT in $(elapsed "$t0") s; log $LOG_FILE"
  echo "KAFKA_START_SECONDS=$(elapsed "$t0")"
  print_env
}

do_stop_locked() {
  local pid
  if ! pid="$(read_pid)"; then
    rm -f "$PID_FILE"
    log "not running (port $PORT)"
    return 0
  fi
  log "stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid still alive after 30 s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    sleep 0.5
  fi
  rm -f "$PID_FILE"
  log "stopped"
}

do_stop() {
  with_lock
  do_stop_locked
}

do_status() {
  local pid
  if pid="$(read_pid)"; then
    if port_open "$PORT" && started_in_log; then
      log "running (pid $pid), ready on $HOST:$PORT, log $LOG_FILE"
      print_env
      return 0
    fi
    log "process $pid alive but not ready on $HOST:$PORT (log $LOG_FILE)"
    return 3
  fi
  log "not running (port $PORT)"
  if is_resolved; then log "jars resolved in $LIB_DIR"; else log "jars not resolved yet"; fi
  return 3
}

usage() {
  sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  resolve) with_lock; check_java; do_resolve ;;
  start) do_start ;;
  stop) do_stop ;;
  restart) do_stop; do_start ;;
  status) do_status ;;
  *) usage ;;
esac
