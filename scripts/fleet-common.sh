# Sourced by scripts/llama-fleet.sh, bench/fleet_ttft.sh and bench/fleet_link.sh (after env.sh): a
# throwaway fleet on this machine.
#   fleet_init LLAMA_BIN_DIR [MODEL]  FLEET_SERVER (its llama-server), FLEET_MODEL (scripts/fetch-model.sh
#                                    MODEL, default smollm2), FLEET_TOOL (e8kv-llama-state, built when
#                                    absent; E8KV_LLAMA_STATE_TOOL overrides), and a work dir
#                                    $FLEET_DIR: everything started below is stopped on exit
#   fleet_start_redis                redis-server on $FLEET_DIR/redis.sock and a free loopback port,
#                                    no persistence; sets FLEET_REDIS_UNIX and FLEET_REDIS_TCP
#   fleet_start_server NAME PORT [ARGS...]
#                                    llama-server ($FLEET_SERVER) on $FLEET_MODEL, one slot, flash
#                                    attention, --slot-save-path $FLEET_DIR/NAME/, context
#                                    ${FLEET_CTX:-8192} tokens; ARGS go to llama-server as they are
#                                    (--kv-e8kv SPEC: e8kv's cache in the server's memory)
#   fleet_wait PORT...               until each server answers /health (exits 1 with the logs if not)
#   fleet_api PORT PATH JSON         POST JSON (or @file) to a server, prints the answer

fleet_init() {
  FLEET_SERVER="$1/llama-server"
  [ -x "$FLEET_SERVER" ] || { echo "[fleet] error: no llama-server in $1" >&2; exit 2; }
  FLEET_MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "${2:-smollm2}")"
  FLEET_TOOL="${E8KV_LLAMA_STATE_TOOL:-$E8KV_BUILD/integrations/llama.cpp/e8kv-llama-state}"
  if [ ! -x "$FLEET_TOOL" ]; then
    E8KV_TARGETS=(e8kv-llama-state)
    configure_and_build >/dev/null
  fi
  FLEET_DIR="$(mktemp -d)"
  FLEET_PIDS=()
  # Before an EXIT trap already set (scripts/netns-link.sh's link_down, say): both run.
  local prev=()
  eval "prev=($(trap -p EXIT))"
  # shellcheck disable=SC2064  # expanded now on purpose: the commands, not the variables
  trap "fleet_cleanup${prev[2]:+; ${prev[2]}}" EXIT
}

fleet_cleanup() {
  local p
  for p in "${FLEET_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${FLEET_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$FLEET_DIR"
}

fleet_start_redis() {
  command -v redis-server >/dev/null || { echo "[fleet] error: redis-server is not installed (scripts/setup.sh)" >&2; exit 2; }
  local port
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  redis-server --port "$port" --bind 127.0.0.1 --unixsocket "$FLEET_DIR/redis.sock" --unixsocketperm 700 \
    --save '' --appendonly no --dir "$FLEET_DIR" --logfile "$FLEET_DIR/redis.log" &
  FLEET_PIDS+=($!)
  for _ in $(seq 1 100); do [ -S "$FLEET_DIR/redis.sock" ] && break; sleep 0.05; done
  [ -S "$FLEET_DIR/redis.sock" ] || { echo "[fleet] redis did not start" >&2; cat "$FLEET_DIR/redis.log" >&2; exit 1; }
  FLEET_REDIS_UNIX="unix://$FLEET_DIR/redis.sock"
  FLEET_REDIS_TCP="redis://127.0.0.1:$port"
}

fleet_start_server() {
  local name="$1" port="$2"
  mkdir -p "$FLEET_DIR/$name"
  "$FLEET_SERVER" -m "$FLEET_MODEL" -c "${FLEET_CTX:-8192}" -np 1 -fa on -t "$E8KV_JOBS" --port "$port" \
    --slot-save-path "$FLEET_DIR/$name/" "${@:3}" > "$FLEET_DIR/server-$name.log" 2>&1 &
  FLEET_PIDS+=($!)
}

fleet_wait() {
  local port
  for port in "$@"; do
    for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
    curl -sf "http://127.0.0.1:$port/health" >/dev/null ||
      { echo "[fleet] server on $port did not start" >&2; cat "$FLEET_DIR"/server-*.log >&2; exit 1; }
  done
}

fleet_api() { curl -sf -X POST "http://127.0.0.1:$1$2" -H 'Content-Type: application/json' -d "$3"; }
