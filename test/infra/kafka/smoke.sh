#!/usr/bin/env bash
# test/infra/kafka/smoke.sh — produce a few keyed messages to a fresh topic on a
# running broker (scripts/kafka-apache.sh start) with kcat, read them back both
# from offset 0 and through a consumer group, and fail unless all came back.
#
#   test/infra/kafka/smoke.sh [BROKERS]     # default $KAFKA_BROKERS or 127.0.0.1:19092
#
# Needs kcat (Debian: apt-get install -y kafkacat; the binary is kcat or kafkacat).
set -euo pipefail

BROKERS="${1:-${KAFKA_BROKERS:-127.0.0.1:19092}}"
N="${SMOKE_MESSAGES:-5}"

KCAT="$(command -v kcat || command -v kafkacat || true)"
[[ -n "$KCAT" ]] || { echo "smoke: kcat not found (apt-get install -y kafkacat)" >&2; exit 1; }

topic="trace-smoke-$(date +%s)-$$"
echo "smoke: brokers $BROKERS, topic $topic (auto-created), $N messages"

for i in $(seq 1 "$N"); do
  printf 'key-%d|{"n":%d,"msg":"hello %d"}\n' "$i" "$i" "$i"
done | "$KCAT" -b "$BROKERS" -t "$topic" -P -K '|' -X message.timeout.ms=30000

got="$("$KCAT" -b "$BROKERS" -t "$topic" -C -o beginning -e -q -m 30 -f '%k=%s\n')"
while IFS= read -r line; do echo "smoke: read  $line"; done <<<"$got"
count="$(grep -c '^key-' <<<"$got" || true)"
[[ "$count" == "$N" ]] || { echo "smoke: FAIL: read $count of $N messages from offset 0" >&2; exit 1; }

group="trace-smoke-group-$$"
got="$("$KCAT" -b "$BROKERS" -G "$group" -X auto.offset.reset=earliest -e -q -f '%k=%s\n' "$topic" 2>/dev/null)"
count="$(grep -c '^key-' <<<"$got" || true)"
[[ "$count" == "$N" ]] || { echo "smoke: FAIL: consumer group $group read $count of $N messages" >&2; exit 1; }
echo "smoke: consumer group $group read $count messages"

"$KCAT" -b "$BROKERS" -L -t "$topic" | sed 's/^/smoke: /'
echo "smoke: OK"
