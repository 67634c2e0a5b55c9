#!/usr/bin/env bash
# Load test of authenticated GET /v1/me against a bare route (GET /healthz)
# of the same release server on SQLite, with wrk, in one run.
#
#   bash benches/load.sh            # 10 s per route, 64 connections
#   DURATION=30s CONNECTIONS=128 bash benches/load.sh
#
# Prints requests/s of both routes and their ratio. Figures depend on the
# machine; nothing here asserts them.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-10s}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-2}"
command -v wrk >/dev/null || { apt-get install -y -qq wrk >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq wrk); }
cargo build --release -q -p service
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
token="svc_bench_token_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
SERVICE_DATA_DIR="$dir" SERVICE_BIND="127.0.0.1:$port" SERVICE_BOOTSTRAP_TOKEN="$token" SERVICE_LOG=warn \
  ./target/release/service serve >/dev/null 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
run() { wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency "$@" | tee /dev/stderr | awk '/Requests\/sec/ {print $2}'; }
echo "== bare route: GET /healthz" >&2
bare=$(run "http://127.0.0.1:$port/healthz")
echo "== authenticated: GET /v1/me" >&2
me=$(run -H "Authorization: Bearer $token" "http://127.0.0.1:$port/v1/me")
python3 - "$bare" "$me" <<'PY'
import sys
bare, me = float(sys.argv[1]), float(sys.argv[2])
print(f"GET /healthz: {bare:,.0f} req/s")
print(f"GET /v1/me:   {me:,.0f} req/s  ({100*me/bare:.1f}% of the bare route)")
PY
