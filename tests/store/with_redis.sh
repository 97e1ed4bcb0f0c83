#!/usr/bin/env bash
# Runs a command with its own redis-server: a Unix socket and a free loopback port in a fresh temp
# dir, no persistence (--save '' --appendonly no), stopped (and the dir removed) on exit.
# Exports E8KV_TEST_REDIS_UNIX=unix://<dir>/redis.sock, E8KV_TEST_REDIS_TCP=redis://127.0.0.1:<port>,
# E8KV_TEST_REDIS_DIR=<dir> and E8KV_TEST_REDIS_CONF (the arguments, for a restart by the test).
# Exits 77 (CTest's SKIP_RETURN_CODE: "skipped") only when redis-server is not installed.
#   tests/store/with_redis.sh COMMAND [ARGS...]
set -euo pipefail
REDIS_SERVER="${E8KV_REDIS_SERVER:-$(command -v redis-server || true)}"
if [ -z "$REDIS_SERVER" ]; then
  echo "[with_redis] redis-server is not installed (Debian: redis-server; scripts/setup.sh installs it): skipped" >&2
  exit 77
fi
dir="$(mktemp -d "${TMPDIR:-/tmp}/e8kv-redis.XXXXXX")"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [ -f "$dir/redis.pid" ]; then kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
conf=(--port "$port" --bind 127.0.0.1 --unixsocket "$dir/redis.sock" --unixsocketperm 700
      --save '' --appendonly no --dir "$dir" --pidfile "$dir/redis.pid" --daemonize no --loglevel warning
      --logfile "$dir/redis.log")
"$REDIS_SERVER" "${conf[@]}" &
pid=$!
for _ in $(seq 1 100); do
  [ -S "$dir/redis.sock" ] && break
  kill -0 "$pid" 2>/dev/null || { echo "[with_redis] redis-server exited:" >&2; cat "$dir/redis.log" >&2; exit 1; }
  sleep 0.05
done
[ -S "$dir/redis.sock" ] || { echo "[with_redis] redis-server did not start within 5 s" >&2; exit 1; }
export E8KV_TEST_REDIS_UNIX="unix://$dir/redis.sock" E8KV_TEST_REDIS_TCP="redis://127.0.0.1:$port"
export E8KV_TEST_REDIS_DIR="$dir" E8KV_TEST_REDIS_SERVER="$REDIS_SERVER"
set +e
"$@"
rc=$?
set -e
exit $rc
