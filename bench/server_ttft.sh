#!/usr/bin/env bash
# Time to first token of llama-server with --kv-e8kv against llama.cpp's own cache, at real prompt
# lengths: a PROMPT-token document (first turn: the whole prefill), then a 256-token second turn
# that extends it (/completion with cache_prompt: the server keeps the first turn's cache and
# processes only the new tokens), n_predict 1, greedy. One server per cache option, started fresh
# and alone on this machine; REPS repetitions per row (each on an erased slot: the slot actions need
# --slot-save-path), medians printed.
#
#   bench/server_ttft.sh [PROMPT (default 16384)] [REPS (default 3)] [rows (default "f16 e8kv:preset=quant-k3v2 e8kv:preset=tier-k3v2")]
#   E8KV_LLAMA_BIN=dir      llama-server's directory, used as it is (else scripts/build-llama-cpp.sh builds it)
#   E8KV_LLAMA_MODEL=NAME   a model of scripts/fetch-model.sh (default gemma3: llama-server caps a slot's
#                           context at the model's training context, SmolLM2's 8,192 is below the default prompt)
# Loopback only; the servers are stopped on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
PROMPT="${1:-16384}"
REPS="${2:-3}"
ROWS="${3:-f16 e8kv:preset=quant-k3v2 e8kv:preset=tier-k3v2}"
if [ -n "${E8KV_LLAMA_BIN:-}" ]; then  # a build of another commit (an A/B), used as it is
  BIN="$E8KV_LLAMA_BIN"
  export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  BIN="$(bash "$E8KV_ROOT/scripts/build-llama-cpp.sh" llama-server)"
fi
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "${E8KV_LLAMA_MODEL:-gemma3}")"
TEXT_DIR="$(dirname "$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | head -1)")"
WORK="$(mktemp -d)"
PID=""
cleanup() {
  [ -n "$PID" ] && { pkill -P "$PID" 2>/dev/null; wait "$PID" 2>/dev/null; }
  rm -rf "$WORK"
}
trap cleanup EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
echo "llama-server, $(basename "$MODEL"), a $PROMPT-token prompt then a 256-token second turn (cache_prompt), n_predict 1, -fa on -t $E8KV_JOBS -c $((PROMPT + 1024)); medians of $REPS; $(date -u +%F), $(nproc) cores"
printf "| %-24s | %14s | %18s | %9s |\n" "KV cache" "first turn" "second turn" "peak RSS"
printf "|%s|%s|%s|%s|\n" "--------------------------" "----------------" "--------------------" "-----------"
for r in $ROWS; do
  case "$r" in
    e8kv:*) kv=(--kv-e8kv "${r#e8kv:}") ;;
    *) kv=(-ctk "$r" -ctv "$r") ;;
  esac
  log="$WORK/server-${r//[:=,]/_}.log"
  /usr/bin/time -f "maxrss_kb %M" "$BIN/llama-server" -m "$MODEL" -c $((PROMPT + 1024)) -b 2048 -ub 512 -np 1 -fa on --slot-save-path "$WORK" \
    -t "$E8KV_JOBS" --port "$port" --host 127.0.0.1 "${kv[@]}" > "$log" 2>&1 &
  PID=$!
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.5; done
  times="$(python3 "$E8KV_ROOT/bench/server_ttft.py" --port "$port" --text "$TEXT_DIR/tech.txt" --text "$TEXT_DIR/fiction.txt" \
           --prompt "$PROMPT" --reps "$REPS")" || { echo "[server-ttft] $r failed; server log:" >&2; tail -20 "$log" >&2; exit 1; }
  # Stop the server, not /usr/bin/time around it (which then prints the peak RSS).
  pkill -P "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=""
  rss=$(grep -oE "maxrss_kb [0-9]+" "$log" | awk '{printf "%.0f MiB", $2 / 1024}' || true)
  printf "| %-24s | %14s | %18s | %9s |\n" "$r" "$(echo "$times" | cut -d' ' -f1) ms" "$(echo "$times" | cut -d' ' -f2) ms" "$rss"
done
