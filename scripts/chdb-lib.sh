#!/usr/bin/env bash
# scripts/chdb-lib.sh — libchdb.so (ClickHouse 26.7 in-process, chDB) for the
# `chdb` build-tagged tests of package sink (sink/chdb_test.go).
#
#   scripts/chdb-lib.sh          # fetch once, then print where the library is
#
# The library comes from the npm package @chdb/lib-linux-x64-gnu, fetched with
# `npm pack` (npm's configured registry; no install, no scripts run) and
# unpacked under $TRACE_CHDB_HOME (default /var/cache/trace/chdb). A second run
# finds it there and downloads nothing. The download is ~178 MB, unpacked
# ~566 MB; the tarball and npm's cache are removed after unpacking.
#
# Progress and timings go to stderr. The last line on stdout is
#   CHDB_LIB_PATH=/var/cache/trace/chdb/lib-linux-x64-gnu-26.7.3-stable.1/.../libchdb.so
# so a caller can do:
#   export "$(scripts/chdb-lib.sh | tail -n 1)"
#   go test -tags chdb -run Chdb -count=1 ./sink/
#
# Environment (all optional):
#   TRACE_CHDB_HOME   cache dir (default /var/cache/trace/chdb)
#   TRACE_NPM         npm binary (default npm)
set -euo pipefail

PKG="@chdb/lib-linux-x64-gnu"
VERSION="26.7.3-stable.1"
CHDB_HOME="${TRACE_CHDB_HOME:-/var/cache/trace/chdb}"
NPM="${TRACE_NPM:-npm}"
DEST="$CHDB_HOME/lib-linux-x64-gnu-$VERSION"
STAMP="$DEST/.trace-chdb-lib" # holds the library's path once fully unpacked
LOCK_FILE="$CHDB_HOME/.lock"

log() { printf '[chdb-lib] %s\n' "$*" >&2; }
die() { printf '[chdb-lib] ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# cached prints the library's path when a previous run unpacked it completely.
cached() {
  [[ -f "$STAMP" ]] || return 1
  local p
  p="$(cat "$STAMP")"
  [[ -n "$p" && -s "$p" ]] || return 1
  printf '%s\n' "$p"
}

t0="$(now)"
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) die "$PKG is for Linux x86-64 (glibc); this is $(uname -s)-$(uname -m)" ;;
esac

if lib="$(cached)"; then
  log "cached: $lib ($(du -m "$lib" | cut -f1) MB, chDB $VERSION; $(since "$t0") s)"
  printf 'CHDB_LIB_PATH=%s\n' "$lib"
  exit 0
fi

mkdir -p "$CHDB_HOME"
exec 9>"$LOCK_FILE"
flock -w 1800 9 || die "could not take the lock $LOCK_FILE within 1800 s (another chdb-lib.sh running?)"
# Another run may have finished while this one waited for the lock.
if lib="$(cached)"; then
  log "cached: $lib (unpacked by a concurrent run; $(since "$t0") s)"
  printf 'CHDB_LIB_PATH=%s\n' "$lib"
  exit 0
fi

command -v "$NPM" >/dev/null 2>&1 || die "npm not found (apt-get install -y npm, or set TRACE_NPM)"
work="$(mktemp -d "$CHDB_HOME/fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

log "fetching $PKG@$VERSION with npm pack (~178 MB) into $CHDB_HOME"
t_dl="$(now)"
# A private npm cache, removed with $work: the tarball is not kept twice.
if ! (cd "$work" && "$NPM" pack "$PKG@$VERSION" --ignore-scripts --loglevel=error \
  --cache "$work/npm-cache" --pack-destination "$work" >"$work/pack.log" 2>&1); then
  tail -n 40 "$work/pack.log" >&2 || true
  die "npm pack $PKG@$VERSION failed"
fi
tgz="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
[[ -n "$tgz" ]] || die "npm pack produced no tarball (log: $(tr '\n' ' ' <"$work/pack.log"))"
log "downloaded $(basename "$tgz") ($(du -m "$tgz" | cut -f1) MB) in $(since "$t_dl") s"

t_untar="$(now)"
rm -rf "$DEST" "$DEST.partial"
mkdir -p "$DEST.partial"
tar -xzf "$tgz" -C "$DEST.partial"
rm -rf "$work/npm-cache" "$tgz"
rel="$(cd "$DEST.partial" && find . -name libchdb.so -type f | head -n 1)"
[[ -n "$rel" ]] || die "no libchdb.so in $PKG@$VERSION (contents: $(cd "$DEST.partial" && find . -maxdepth 3 | head -n 20 | tr '\n' ' '))"
[[ "$(head -c 4 "$DEST.partial/$rel" | od -An -c | tr -d ' ')" == '177ELF' ]] || die "$rel is not an ELF library"
mv "$DEST.partial" "$DEST"
lib="$DEST/${rel#./}"
printf '%s\n' "$lib" >"$STAMP"
log "unpacked to $DEST ($(du -sm "$DEST" | cut -f1) MB) in $(since "$t_untar") s; total $(since "$t0") s"
printf 'CHDB_LIB_PATH=%s\n' "$lib"
