#!/usr/bin/env bash
# Fuzzes a live host against its own OpenAPI document (issue 17; docs/api.md):
# schemathesis (pinned, in a venv) generates requests for every operation of
# GET /api/openapi.json and checks that no answer is a 5xx
# (not_a_server_error), every status is one the operation documents
# (status_code_conformance), every body fits its documented schema
# (response_schema_conformance), and no refused request changed a row
# (no_partial_write, .ci/schemathesis_hooks.py). Any failure fails the run.
# Before fuzzing, the served document itself is checked against the OpenAPI
# 3.1 rules with openapi-spec-validator (pinned, same venv; issue 25):
# unique operationIds, resolvable $refs, valid parameters and schemas.
#
# The host is the debug binary the test run built (MERCURY_BIN to choose
# another), on a loopback port, with a scripted model and the process
# sandbox, in a throwaway data dir. Extra arguments go to `st run` (e.g.
# `--include-path /api/tasks` to fuzz one path while fixing it).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
SPEC_VALIDATOR_VERSION=0.9.0
BIN=${MERCURY_BIN:-${CARGO_TARGET_DIR:-target}/debug/mercury}
VENV=${SCHEMATHESIS_VENV:-.venv}
MAX_EXAMPLES=${SCHEMATHESIS_MAX_EXAMPLES:-25}
MAX_TIME=${SCHEMATHESIS_MAX_TIME:-210}

if [ ! -x "$BIN" ]; then
    cargo build --features test-hooks --bin mercury
fi
if [ ! -x "$VENV/bin/st" ] || ! "$VENV/bin/st" --version | grep -q "$SCHEMATHESIS_VERSION" \
    || ! "$VENV/bin/pip" show openapi-spec-validator 2>/dev/null | grep -qx "Version: $SPEC_VALIDATOR_VERSION"; then
    if [ ! -x "$VENV/bin/pip" ] && ! python3 -m venv "$VENV"; then
        apt-get install -y -qq python3-venv >/dev/null
        /usr/bin/python3 -m venv "$VENV"
    fi
    "$VENV/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION" \
        "openapi-spec-validator==$SPEC_VALIDATOR_VERSION"
fi

WORK=$(mktemp -d)
DATA="$WORK/data"
HOST_PID=""
cleanup() {
    if [ -n "$HOST_PID" ]; then
        kill "$HOST_PID" 2>/dev/null || true
        wait "$HOST_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN" init --data-dir "$DATA" >/dev/null
mkdir -p "$DATA/models"
echo '{"rules": [{"reply": "ok"}]}' > "$DATA/models/fuzz.json"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"

MERCURY_BIND="127.0.0.1:$PORT" \
MERCURY_MODEL="scripted:$DATA/models/fuzz.json" \
MERCURY_SANDBOX_BACKEND=process \
MERCURY_SANDBOX_ALLOW_UNISOLATED=true \
MERCURY_LOG=error \
    "$BIN" serve --data-dir "$DATA" > "$WORK/host.log" 2>&1 &
HOST_PID=$!
for _ in $(seq 1 200); do
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS "$URL/healthz" >/dev/null || { cat "$WORK/host.log"; echo "the fuzz host did not start"; exit 1; }

TOKEN=$(tr -d '[:space:]' < "$DATA/global/owner.token")
SPACE=fuzz
curl -fsS -X POST "$URL/api/spaces" -H "Authorization: Bearer $TOKEN" \
    -H 'content-type: application/json' -d "{\"id\":\"$SPACE\"}" >/dev/null

# The document must be valid OpenAPI before it is worth fuzzing against.
curl -fsS "$URL/api/openapi.json" -o "$WORK/openapi.json"
echo "openapi-spec-validator $SPEC_VALIDATOR_VERSION on $URL/api/openapi.json"
"$VENV/bin/openapi-spec-validator" "$WORK/openapi.json"

echo "schemathesis $SCHEMATHESIS_VERSION against $URL/api/openapi.json (max $MAX_EXAMPLES cases per operation, ${MAX_TIME}s)"
status=0
MERCURY_FUZZ_DB="$DATA/state.db" MERCURY_FUZZ_URL="$URL" MERCURY_FUZZ_TOKEN="$TOKEN" \
MERCURY_FUZZ_SPACE="$SPACE" SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH=.ci \
    "$VENV/bin/st" run "$URL/api/openapi.json" \
    --checks not_a_server_error,status_code_conformance,response_schema_conformance,no_partial_write \
    --header "Authorization: Bearer $TOKEN" \
    --header "x-mercury-space: $SPACE" \
    --exclude-path /api/test/panic \
    --phases examples,coverage,fuzzing \
    --max-examples "$MAX_EXAMPLES" \
    --max-time "$MAX_TIME" \
    --workers 1 \
    --request-timeout 60 \
    --seed 17 \
    --no-color "$@" || status=$?
if [ "$status" -ne 0 ]; then
    echo "--- host log (errors) ---"
    tail -n 50 "$WORK/host.log"
fi
exit "$status"
