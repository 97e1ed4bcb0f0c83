#!/usr/bin/env bash
# Load and fault harness of llama-server with --kv-e8kv against llama.cpp's own f16 cache (issue 49).
# Per row (cache option), three fresh servers on a free loopback port, one after the other:
#   1. reference: bench/server_load.py --mode reference serves every compared unit alone;
#   2. load: the driver's solo phase (asserted equal to the reference, a slot saved / erased /
#      restored), then 8 client streams against -np 4 (prompts 16 to a few thousand tokens, chats,
#      disconnects, over-long prompts, slot 0 saved and restored while the others decode); the
#      server's RSS is sampled every second (/proc/PID/status VmRSS) and read by the driver after
#      the first ~50 requests and after the last, both with every slot erased;
#   3. restart: the slot file saved in 2. restored on a new server, the conversation continued.
# Then one table row per cache option. Exit status 1 when a check failed in any row.
#
#   bench/server_load.sh [--short] [--requests N] [rows (default "f16 e8kv:preset=quant-k3v2 e8kv:preset=tier-k3v2")]
#   bench/server_load.sh --wall [REPS (default 3)] [rows]
#   --short                 short form (CI: ctest llama_server_load_test): 48 requests, prompts up to ~2,200 tokens, no RSS assertion
#   (default)               long form: 500 requests (--requests N), prompts up to ~6,000 tokens and a
#                           conversation that runs into the end of its slot; growth <= 5 % asserted of RSS less
#                           the host prompt cache (its size read from the server's log, -lv 4)
#   --wall                  instead: one fresh server per row, a lone conversation run into the end of its
#                           slot REPS times (6,000 tokens, a turn reusing them past the slot's context,
#                           a turn longer than the slot), the same answers each time, RSS after each
#   E8KV_LLAMA_BIN=dir      llama-server's directory (else scripts/build-llama-cpp.sh llama-server builds it);
#                           exported as LD_LIBRARY_PATH so the libraries beside it are used
#   E8KV_LLAMA_MODEL=name   a model of scripts/fetch-model.sh (default smollm2: 8,192 trained positions)
#   E8KV_LOAD_SLOT_CTX=N    context of each of the 4 slots (default 7168: -c 28672)
#   E8KV_LOAD_CACHE_RAM=MiB llama-server's --cache-ram (default 16: the host prompt cache holds idle
#                           slots' states; llama.cpp's default of 8192 MiB lets RSS grow by design)
#   E8KV_LOAD_GDB=1         run each load server under gdb (backtrace in its log if it crashes)
#   E8KV_LOAD_OUT=dir       where logs, summaries and slot files go (default: a new temporary
#                           directory, kept and printed)
# Loopback only; every server started here is stopped on exit.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
SHORT=()
REQ=()
WALL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) SHORT=(--short); shift ;;
    --wall) WALL=3; shift; case "${1:-}" in [0-9]*) WALL="$1"; shift ;; esac ;;
    --requests) REQ=(--requests "$2"); shift 2 ;;
    *) break ;;
  esac
done
ROWS="${*:-f16 e8kv:preset=quant-k3v2 e8kv:preset=tier-k3v2}"
if [ -n "${E8KV_LLAMA_BIN:-}" ]; then
  BIN="$E8KV_LLAMA_BIN"
  export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  BIN="$(bash "$E8KV_ROOT/scripts/build-llama-cpp.sh" llama-server)"
fi
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "${E8KV_LLAMA_MODEL:-smollm2}")"
mapfile -t TEXTS < <(bash "$E8KV_ROOT/scripts/fetch-text.sh")
TEXT_ARGS=()
for t in "${TEXTS[@]}"; do TEXT_ARGS+=(--text "$t"); done
SLOT_CTX="${E8KV_LOAD_SLOT_CTX:-7168}"
CACHE_RAM="${E8KV_LOAD_CACHE_RAM:-16}"
OUT="${E8KV_LOAD_OUT:-$(mktemp -d /tmp/server-load.XXXXXX)}"
mkdir -p "$OUT"
DRIVER="$E8KV_ROOT/bench/server_load.py"

PID=""      # the llama-server (or gdb) process running now
SAMPLER=""  # the RSS sampler
stop_server() {
  local rc=0
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=""; fi
  if [ -n "$PID" ]; then
    if kill -0 "$PID" 2>/dev/null; then
      kill -TERM "${SERVER_PID:-$PID}" 2>/dev/null || true
      for _ in $(seq 1 60); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
      kill -0 "$PID" 2>/dev/null && { echo "[server-load] llama-server $PID ignored SIGTERM for 30 s: killed" >&2; kill -KILL "$PID" 2>/dev/null || true; }
    fi
    wait "$PID" 2>/dev/null || rc=$?
    PID=""
  fi
  return $rc
}
cleanup() { stop_server || true; }
trap cleanup EXIT

port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
SERVER_PID=""
# start_server LOG SLOTDIR [gdb] -- cache args...
start_server() {
  local log="$1" slots="$2" gdb="$3"; shift 3
  local cmd=("$BIN/llama-server" -m "$MODEL" -c $((4 * SLOT_CTX)) -np 4 -b 2048 -ub 512 -fa on -t "$E8KV_JOBS"
             --cache-ram "$CACHE_RAM" --slot-save-path "$slots/" --host 127.0.0.1 --port "$port" -lv 4 "$@")
  if [ "$gdb" = 1 ]; then
    gdb -q -batch -ex "set startup-with-shell off" -ex "set pagination off" -ex "handle SIGTERM nostop noprint pass" \
        -ex "handle SIGPIPE nostop noprint pass" -ex run -ex "thread apply all bt" \
        --args "${cmd[@]}" > "$log" 2>&1 < /dev/null &
    PID=$!
    SERVER_PID=""
    for _ in $(seq 1 100); do SERVER_PID="$(pgrep -P "$PID" -x llama-server || true)"; [ -n "$SERVER_PID" ] && break; sleep 0.2; done
  else
    "${cmd[@]}" > "$log" 2>&1 &
    PID=$!
    SERVER_PID=$PID
  fi
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.5
  done
  echo "[server-load] llama-server did not become healthy; log tail:" >&2
  tail -20 "$log" >&2
  return 1
}

form="long"; [ ${#SHORT[@]} -gt 0 ] && form="short"
if [ -n "$WALL" ]; then
  echo "[server-load] wall: $WALL repetitions per row; llama-server $BIN; $(basename "$MODEL"); -c $((4 * SLOT_CTX)) -np 4; $(date -u '+%F %T') UTC; output in $OUT"
  STATUS=0
  for r in $ROWS; do
    case "$r" in e8kv:*) kv=(--kv-e8kv "${r#e8kv:}") ;; *) kv=(-ctk "$r" -ctv "$r") ;; esac
    tag="${r//[:=,]/_}"
    mkdir -p "$OUT/slots-$tag"
    start_server "$OUT/server-$tag-wall.log" "$OUT/slots-$tag" "${E8KV_LOAD_GDB:-0}" "${kv[@]}" || { STATUS=1; continue; }
    echo "[server-load] $r"
    python3 "$DRIVER" --mode wall --reps "$WALL" --port "$port" --ref /dev/null --corpus-cache "$OUT/corpus.json" \
      "${TEXT_ARGS[@]}" --pid "$SERVER_PID" --server-log "$OUT/server-$tag-wall.log" --summary "$OUT/wall-$tag.json" || STATUS=1
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "[server-load] $r: llama-server died" >&2; tail -40 "$OUT/server-$tag-wall.log" >&2; STATUS=1; }
    stop_server || true
  done
  exit $STATUS
fi
echo "[server-load] $form form; llama-server $BIN; $(basename "$MODEL"); -c $((4 * SLOT_CTX)) -np 4 -b 2048 -ub 512 -fa on -t $E8KV_JOBS --cache-ram $CACHE_RAM; $(date -u '+%F %T') UTC, $(nproc) cores; output in $OUT"
STATUS=0
ROW_LINES=()
for r in $ROWS; do
  case "$r" in
    e8kv:*) kv=(--kv-e8kv "${r#e8kv:}") ;;
    *) kv=(-ctk "$r" -ctv "$r") ;;
  esac
  tag="${r//[:=,]/_}"
  slots="$OUT/slots-$tag"
  mkdir -p "$slots"
  common=(--port "$port" --ref "$OUT/ref-$tag.json" --corpus-cache "$OUT/corpus.json" "${TEXT_ARGS[@]}" "${SHORT[@]}" "${REQ[@]}")
  row_fail=""
  t_row=$SECONDS

  echo "[server-load] $r: reference (each compared unit served alone on a fresh server)"
  start_server "$OUT/server-$tag-reference.log" "$slots" 0 "${kv[@]}" || { row_fail="reference server did not start"; }
  if [ -z "$row_fail" ]; then
    python3 "$DRIVER" --mode reference "${common[@]}" --pid "$SERVER_PID" || row_fail="reference run failed"
    stop_server || echo "[server-load] $r: the reference server exited with status $?" >&2
  fi

  if [ -z "$row_fail" ]; then
    echo "[server-load] $r: load"
    start_server "$OUT/server-$tag-load.log" "$slots" "${E8KV_LOAD_GDB:-0}" "${kv[@]}" || row_fail="load server did not start"
  fi
  if [ -z "$row_fail" ]; then
    ( while kill -0 "$SERVER_PID" 2>/dev/null; do
        echo "$(date +%s) $(awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null)"; sleep 1
      done ) > "$OUT/rss-$tag.log" &
    SAMPLER=$!
    python3 "$DRIVER" --mode load "${common[@]}" --pid "$SERVER_PID" --server-log "$OUT/server-$tag-load.log" \
      --summary "$OUT/summary-$tag.json" \
      --results "$OUT/results-$tag.jsonl" | tee "$OUT/driver-$tag.txt" || row_fail="load checks failed"
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      row_fail="${row_fail:+$row_fail; }llama-server died"
      echo "[server-load] $r: llama-server is gone; log tail:" >&2; tail -40 "$OUT/server-$tag-load.log" >&2
    fi
    rc=0; stop_server || rc=$?
    # SIGTERM: llama-server shuts down cleanly (status 0); anything else is reported
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 143 ]; then
      row_fail="${row_fail:+$row_fail; }load server exit status $rc"
      tail -40 "$OUT/server-$tag-load.log" >&2
    fi
  fi

  if [ -z "$row_fail" ] || [ "$row_fail" = "load checks failed" ]; then
    echo "[server-load] $r: restart (restore the saved slot on a new server, continue the conversation)"
    if start_server "$OUT/server-$tag-restart.log" "$slots" 0 "${kv[@]}"; then
      python3 "$DRIVER" --mode restart "${common[@]}" --pid "$SERVER_PID" --summary "$OUT/restart-$tag.json" \
        || row_fail="${row_fail:+$row_fail; }restart check failed"
      stop_server || true
    else
      row_fail="${row_fail:+$row_fail; }restart server did not start"
    fi
  fi
  peak=$(awk 'NF == 2 && $2 > m {m = $2} END {printf "%.0f", m / 1024}' "$OUT/rss-$tag.log" 2>/dev/null || echo "-")
  line="$(python3 - "$OUT/summary-$tag.json" "$OUT/restart-$tag.json" "$r" "$peak" "$((SECONDS - t_row))" "${row_fail:-pass}" <<'EOF'
import json, os, sys
summ, rest, row, peak, secs, verdict = sys.argv[1:]
s = json.load(open(summ)) if os.path.exists(summ) else {}
t = json.load(open(rest)) if os.path.exists(rest) else {}
f = lambda v, fmt="{:.0f}": "-" if v is None else fmt.format(v)
errs = ", ".join(f"{k} {v}" for k, v in sorted(s.get("outcomes", {}).items()) if k != "ok") or "-"
c = s.get("categories", {})
ident = lambda name: f"{c[name]['identical']}/{c[name]['compared']}" if name in c else "-"
load_ident = s.get("identical_under_load", {})
rss = (f"{f(s.get('rss_first_kb') and s['rss_first_kb'] / 1024)} -> {f(s.get('rss_last_kb') and s['rss_last_kb'] / 1024)} MiB "
       f"({f(s.get('rss_growth_pct'), '{:+.1f}')} %; less the prompt cache {f(s.get('rss_less_prompt_cache_growth_pct'), '{:+.1f}')} %), peak {peak}")
restart = "-" if not t else ("identical" if t.get("identical") else f"differs at {t.get('first_diff')}")
print(f"| {row} | {s.get('answered_ok', '-')}/{s.get('requests', '-')} | {errs} | {rss} | "
      f"{f(s.get('ttft_ms_p50'))} / {f(s.get('ttft_ms_p99'))} | {f(s.get('tps_stream_p50'), '{:.1f}')} | "
      f"{load_ident.get('identical', '-')}/{load_ident.get('compared', '-')} (singles {ident('single')}, long {ident('single-long')}, "
      f"chat reused {ident('chat-reused')}, recomputed {ident('chat-recomputed')}, resume {ident('resume-after-cancel')}, "
      f"restore {ident('ctl-turn2-after-restore')}) | {ident('solo')} + {ident('solo-after-restore')} | {restart} | {secs} s | {verdict} |")
EOF
)"
  ROW_LINES+=("$line")
  [ -n "$row_fail" ] && STATUS=1
  echo "$line"
done
echo
echo "llama-server load ($form form), $(basename "$MODEL"), -np 4, 8 client streams; $(date -u +%F), $(nproc) cores; logs in $OUT"
echo "| KV cache | answered | other outcomes | RSS first ~50 -> last (erased slots) | TTFT p50 / p99 ms | t/s per stream p50 | identical under load | solo (asserted) | restart | time | verdict |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for l in "${ROW_LINES[@]}"; do echo "$l"; done
exit $STATUS
