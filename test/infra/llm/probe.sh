#!/usr/bin/env bash
# test/infra/llm/probe.sh — send every examples/*.request.json to a running
# OpenAI-compatible server (scripts/llm-server.sh start) and write the answers
# next to them as examples/*.response.json, so the wire shapes stay documented.
#
#   test/infra/llm/probe.sh [BASE_URL]     # default $TRACE_TEST_LLM_URL or http://127.0.0.1:18080/v1
#   test/infra/llm/probe.sh URL NAME...    # only examples/NAME.request.json
#
# For each request it prints the HTTP status, the wall time, the usage block and,
# where the request has a response_format, whether the content parses as strict
# JSON (Python json.loads, which, like Go's encoding/json, rejects raw control
# characters inside strings).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
EXAMPLES="$HERE/examples"
URL="${1:-${TRACE_TEST_LLM_URL:-http://127.0.0.1:18080/v1}}"
shift || true

curl -fsS --max-time 5 "$URL/models" >/dev/null \
  || { echo "probe: no server answers at $URL/models (run scripts/llm-server.sh start)" >&2; exit 1; }

names=("$@")
if ((${#names[@]} == 0)); then
  for f in "$EXAMPLES"/*.request.json; do
    n="${f##*/}"
    names+=("${n%.request.json}")
  done
fi

for n in "${names[@]}"; do
  req="$EXAMPLES/$n.request.json"
  out="$EXAMPLES/$n.response.json"
  [[ -f "$req" ]] || { echo "probe: missing $req" >&2; exit 1; }
  meta="$(curl -sS --max-time 900 -o "$out" -w '%{http_code} %{time_total}' \
    -H 'Content-Type: application/json' -d @"$req" "$URL/chat/completions")"
  python3 - "$n" "$req" "$out" "$meta" <<'EOF'
import json, sys
name, req_path, out_path, meta = sys.argv[1:5]
code, secs = meta.split()
req = json.load(open(req_path))
try:
    resp = json.load(open(out_path))
except ValueError:
    print(f"{name}: HTTP {code} in {float(secs):.1f}s, body is not JSON")
    sys.exit(0)
line = f"{name}: HTTP {code} in {float(secs):.1f}s"
if "usage" in resp:
    line += f", usage {resp['usage']}"
if "error" in resp:
    line += f", error: {resp['error'].get('message', '')[:160]!r}"
elif req.get("response_format"):
    content = resp["choices"][0]["message"]["content"]
    try:
        json.loads(content)
        line += ", content is strict JSON"
    except ValueError as e:
        line += f", content is NOT strict JSON ({e}; finish_reason {resp['choices'][0]['finish_reason']})"
print(line)
EOF
done
