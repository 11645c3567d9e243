#!/usr/bin/env bash
# Starts a local ClickHouse server in the background for CI (or by hand) and
# waits until it answers /ping.
#
#   deploy/clickhouse/start-local.sh [DIR]      (default /var/lib/trace-ci-clickhouse)
#
# DIR gets config.xml, users.xml, data/, tmp/, logs/ and clickhouse-server.pid.
# The server listens on 127.0.0.1 only: native protocol on $TRACE_CH_TCP_PORT
# (default 9000), HTTP on $TRACE_CH_HTTP_PORT (default 8123); user "default"
# without a password. Stop it with: kill "$(cat DIR/clickhouse-server.pid)".
#
# config.xml and users.xml beside this script are rendered by internal/chserver
# for ClickHouse 18.16 (Debian 12's package) with DIR=/var/lib/trace-ci-clickhouse;
# this script substitutes DIR and the ports, and drops the 18.x-only profile
# setting on newer versions. Running it again with a live server in DIR just
# says so.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
template_dir=/var/lib/trace-ci-clickhouse
dir=${1:-$template_dir}
tcp_port=${TRACE_CH_TCP_PORT:-9000}
http_port=${TRACE_CH_HTTP_PORT:-8123}
ready_timeout=${TRACE_CH_READY_TIMEOUT:-30}

say() { printf 'start-local.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# The server binary: Debian's clickhouse-server, else the official single binary.
if command -v clickhouse-server >/dev/null 2>&1; then
  server=(clickhouse-server)
elif [ -x /usr/sbin/clickhouse-server ]; then
  server=(/usr/sbin/clickhouse-server)
elif command -v clickhouse >/dev/null 2>&1; then
  server=(clickhouse server)
else
  die "no ClickHouse server binary on PATH. Install it: on Debian/Ubuntu 'apt-get install -y clickhouse-server clickhouse-client', or the official single binary ('curl https://clickhouse.com/ | sh', then put ./clickhouse on PATH)."
fi

# Version: Debian's 18.16 clickhouse-server has no --version; ask the client or dpkg.
version=$("${server[@]}" --version 2>/dev/null || clickhouse-client --version 2>/dev/null ||
  dpkg-query -W -f='${Version}' clickhouse-server 2>/dev/null || true)
version=$(printf '%s' "$version" | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)*' | head -n 1 || true)
major=${version%%.*}
rest=${version#*.}
minor=${rest%%.*}
say "using ${server[*]} (version ${version:-unknown})"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
mkdir -p "$dir"/{data,tmp,user_files,format_schemas,logs}
pidfile=$dir/clickhouse-server.pid

ping() {
  if command -v curl >/dev/null 2>&1; then
    curl -sf --max-time 1 "http://127.0.0.1:$http_port/ping" >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$http_port" && printf 'GET /ping HTTP/1.0\r\n\r\n' >&3 &&
      grep -q '^Ok\.' <&3) >/dev/null 2>&1
  fi
}

if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  if ping; then
    say "already running (pid $(cat "$pidfile")) in $dir"
    exit 0
  fi
  die "pid $(cat "$pidfile") from $pidfile is alive but 127.0.0.1:$http_port does not answer; stop it first"
fi
rm -f "$pidfile"

if ping; then
  die "something else already answers on 127.0.0.1:$http_port; set TRACE_CH_HTTP_PORT/TRACE_CH_TCP_PORT or stop it"
fi

esc_dir=$(printf '%s' "$dir" | sed -e 's/[&|\\]/\\&/g')
sed -e "s|$template_dir|$esc_dir|g" \
  -e "s|<tcp_port>9000</tcp_port>|<tcp_port>$tcp_port</tcp_port>|" \
  -e "s|<http_port>8123</http_port>|<http_port>$http_port</http_port>|" \
  "$here/config.xml" >"$dir/config.xml"
users_filter=(cat)
# allow_experimental_low_cardinality_type exists (and is needed) only before 19.3.
if [ -n "$version" ] && { [ "$major" -gt 19 ] || { [ "$major" -eq 19 ] && [ "$minor" -ge 3 ]; }; }; then
  users_filter=(grep -v allow_experimental_low_cardinality_type)
fi
sed -e "s|$template_dir|$esc_dir|g" "$here/users.xml" | "${users_filter[@]}" >"$dir/users.xml"
if [ -n "$version" ] && [ "$major" -ge 22 ]; then
  sed -i -e 's|<yandex>|<clickhouse>|; s|</yandex>|</clickhouse>|' "$dir/config.xml" "$dir/users.xml"
fi

cd "$dir"
nohup "${server[@]}" --config-file="$dir/config.xml" >>"$dir/logs/stdout.log" 2>&1 </dev/null &
pid=$!
echo "$pid" >"$pidfile"

for ((i = 0; i < ready_timeout * 10; i++)); do
  if ping; then
    say "ClickHouse ${version:-?} ready: native 127.0.0.1:$tcp_port, http 127.0.0.1:$http_port, dir $dir, pid $pid"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    say "clickhouse-server exited during start-up. Its output:"
    tail -n 40 "$dir/logs/stdout.log" "$dir/logs/clickhouse-server.err.log" 2>/dev/null >&2 || true
    rm -f "$pidfile"
    exit 1
  fi
  sleep 0.1
done
say "ClickHouse did not answer http://127.0.0.1:$http_port/ping within ${ready_timeout}s. Its logs:"
tail -n 40 "$dir/logs/stdout.log" "$dir/logs/clickhouse-server.err.log" 2>/dev/null >&2 || true
kill "$pid" 2>/dev/null || true
rm -f "$pidfile"
exit 1
