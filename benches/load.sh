#!/usr/bin/env bash
# Load test of authenticated GET /v1/me against a bare route (GET /healthz)
# of the same release server, with wrk: on the embedded SQLite backend and
# on PostgreSQL (the multi-replica backend), several rounds each, medians
# reported. Nothing here asserts the figures; benches/README.md keeps them.
#
#   bash benches/load.sh
#   ROUNDS=5 DURATION=10s CONNECTIONS=64 bash benches/load.sh
#   BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres bash benches/load.sh
#
# The PostgreSQL run creates a database of its own on that server (default
# postgres://postgres@127.0.0.1:5432/postgres) and drops it afterwards; it
# is skipped when no server answers there.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-8s}"
CONNECTIONS="${CONNECTIONS:-64}"
THREADS="${THREADS:-2}"
ROUNDS="${ROUNDS:-3}"
PG_ADMIN_URL="${BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
command -v wrk >/dev/null || { apt-get install -y -qq wrk >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq wrk); }
cargo build --release -q -p service

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "${pg_db:-}" ]; then psql "$PG_ADMIN_URL" -qc "DROP DATABASE IF EXISTS $pg_db WITH (FORCE)" >/dev/null 2>&1 || true; fi
  rm -rf "${dirs[@]:-}"
}
dirs=()
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rps() { wrk -t"$THREADS" -c"$CONNECTIONS" -d"$DURATION" "$@" | awk '/Requests\/sec/ {print $2}'; }

# bench NAME [DATABASE_URL]: starts a server, runs the rounds, prints medians.
bench() {
  local name="$1" url="${2:-}" dir port token pid
  dir=$(mktemp -d); chmod 700 "$dir"; dirs+=("$dir")
  port=$(free_port)
  token="svc_bench_token_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  env SERVICE_DATA_DIR="$dir" SERVICE_BIND="127.0.0.1:$port" SERVICE_BOOTSTRAP_TOKEN="$token" SERVICE_LOG=warn \
    ${url:+DATABASE_URL="$url"} ./target/release/service serve >/dev/null 2>&1 &
  pid=$!; pids+=("$pid")
  for _ in $(seq 1 200); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 0.1; done
  # Caches on PostgreSQL are used once the server listens for notices.
  sleep 1
  local bare=() me=()
  for r in $(seq 1 "$ROUNDS"); do
    bare+=("$(rps "http://127.0.0.1:$port/healthz")")
    me+=("$(rps -H "Authorization: Bearer $token" "http://127.0.0.1:$port/v1/me")")
    echo "  $name round $r: /healthz ${bare[-1]} req/s, /v1/me ${me[-1]} req/s" >&2
  done
  kill "$pid"
  python3 - "$name" "${bare[*]}" "${me[*]}" <<'PY'
import statistics, sys
name, bare, me = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
b, m = statistics.median(bare), statistics.median(me)
print(f"{name}: GET /healthz median {b:,.0f} req/s; GET /v1/me median {m:,.0f} req/s "
      f"(min {min(me):,.0f}, max {max(me):,.0f}) = {100*m/b:.1f}% of the bare route")
PY
}

echo "== $ROUNDS rounds of $DURATION per route, $CONNECTIONS connections, $THREADS wrk threads" >&2
bench "SQLite"
if psql "$PG_ADMIN_URL" -qtAc 'SELECT 1' >/dev/null 2>&1; then
  pg_db="load_bench_$$"
  psql "$PG_ADMIN_URL" -qc "CREATE DATABASE $pg_db" >/dev/null
  bench "PostgreSQL" "$(python3 -c 'import sys,urllib.parse as u; p=u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/"+sys.argv[2])))' "$PG_ADMIN_URL" "$pg_db")"
else
  echo "PostgreSQL: skipped (nothing answers at $PG_ADMIN_URL)" >&2
fi
