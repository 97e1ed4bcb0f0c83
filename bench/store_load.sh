#!/usr/bin/env bash
# A bounded concurrent load on one redis-server (loopback TCP), restarted (SIGTERM) a third of the
# way through and killed (SIGKILL) and started again at two thirds; no persistence, so the
# entries are gone each time. e8kv-fleet-bench load verifies every value it pulls against the
# document pushed under its tokens and exits 1 on any wrong value.
#   bench/store_load.sh [CLIENTS (4)] [SECONDS (30)] [TOKENS per document (512)] [PRESET (quant-k3v2)]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
CLIENTS="${1:-4}"; SECONDS_RUN="${2:-30}"; TOKENS="${3:-512}"; PRESET="${4:-quant-k3v2}"
BENCH="$E8KV_BUILD/integrations/llama.cpp/e8kv-fleet-bench"
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" smollm2)"
W="$(mktemp -d)"; rpid=""
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
start_redis() {
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$W" --logfile "$W/redis.log" &
  rpid=$!
  for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.05; done
}
trap '[ -n "$rpid" ] && kill $rpid 2>/dev/null; wait 2>/dev/null; rm -rf "$W"' EXIT
start_redis
"$BENCH" load --model "$MODEL" --store "redis://127.0.0.1:$port" --clients "$CLIENTS" --seconds "$SECONDS_RUN" \
  --synthetic "$TOKENS" --preset "$PRESET" > "$W/load.txt" 2>&1 &
bench=$!
sleep "$(python3 -c "print($SECONDS_RUN / 3 + 3)")"   # + the documents' set-up (compression)
echo "[load] restart (SIGTERM) at $(date +%T)"; kill -TERM "$rpid"; wait "$rpid" || true; sleep 1; start_redis
sleep "$(python3 -c "print($SECONDS_RUN / 3)")"
echo "[load] kill -9 at $(date +%T)"; kill -KILL "$rpid"; wait "$rpid" 2>/dev/null || true; sleep 1; start_redis
rc=0; wait "$bench" || rc=$?
cat "$W/load.txt"
exit $rc
