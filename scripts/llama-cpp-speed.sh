#!/usr/bin/env bash
# Prefill and decode speed and memory of llama.cpp's KV-cache options with llama.cpp's own tool,
# `llama-bench`, flash attention on, one cache option per llama-bench run, in one script run so that
# every row meets the same machine: pp (a prompt of N_PROMPT tokens arriving after a context of
# DEPTH tokens: a first prompt at depth 0, a chat's next turn at depth) and tg (N_GEN tokens
# generated after DEPTH tokens), llama-bench's own t/s. Rows: llama.cpp's types (-ctk/-ctv; its
# Hadamard rotation of quantized caches on by default) and e8kv as llama.cpp's KV memory
# (`e8kv:SPEC` rows, --kv-e8kv SPEC). Peak RSS of each run from /usr/bin/time (model, compute
# buffers and the cache at its largest). (llama-bench silences llama.cpp's log, and with it e8kv's
# bits line: the bits are in scripts/llama-cpp-kv-types.sh's tables.)
#
#   scripts/llama-cpp-speed.sh [depths (default "4096")] [rows] [threads (default "1 2")]
#   E8KV_LLAMA_BIN=dir        llama-bench's directory, used as it is (else scripts/build-llama-cpp.sh builds it)
#   E8KV_LLAMA_MODEL=gemma3   another model (scripts/fetch-model.sh names)
#   E8KV_BENCH_REPS=2         llama-bench repetitions (-r)
#   E8KV_BENCH_PP=512         prompt tokens of the pp test (0: tg only)
#   E8KV_BENCH_GEN=16         generated tokens of the tg test (0: pp only)
#   --quiet as the first argument: no progress lines on stderr
set -euo pipefail
QUIET=0
if [ "${1:-}" = "--quiet" ]; then QUIET=1; shift; fi
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
DEPTHS="${1:-4096}"
ROWS="${2:-f16 q8_0 q4_0 e8kv:preset=quant-k3v2 e8kv:preset=tier-k3v2}"
THREADS="${3:-1 2}"
REPS="${E8KV_BENCH_REPS:-2}"
N_PROMPT="${E8KV_BENCH_PP:-0}"
N_GEN="${E8KV_BENCH_GEN:-16}"
if [ -n "${E8KV_LLAMA_BIN:-}" ]; then  # a build of another commit (an A/B), used as it is
  BIN="$E8KV_LLAMA_BIN"
  export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  BIN="$(bash "$E8KV_ROOT/scripts/build-llama-cpp.sh" llama-bench)"
fi
MODEL_NAME="${E8KV_LLAMA_MODEL:-smollm2}"
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "$MODEL_NAME")"
LOGS="$(dirname "$BIN")/bench-logs"
mkdir -p "$LOGS"
echo "llama-bench, $MODEL_NAME, pp$N_PROMPT and tg$N_GEN at depth -d, -fa on, -r $REPS, -b 2048 -ub 512 (llama-bench's defaults); $(date -u +%F), $(nproc) cores"
printf "| %-24s | %6s | %7s | %-16s | %-16s | %9s |\n" "KV cache" depth threads "pp$N_PROMPT t/s" "tg$N_GEN t/s" "peak RSS"
printf "|%s|%s|%s|%s|%s|%s|\n" "--------------------------" "--------" "---------" "------------------" "------------------" "-----------"
for d in $DEPTHS; do
  for t in $THREADS; do
    for r in $ROWS; do
      case "$r" in
        e8kv:*) kv=(--kv-e8kv "${r#e8kv:}") ;;
        *) kv=(-ctk "$r" -ctv "$r") ;;
      esac
      log="$LOGS/$MODEL_NAME-d$d-t$t-pp$N_PROMPT-tg$N_GEN-${r//[:=,]/_}.log"
      [ "$QUIET" = 1 ] || echo "[speed] $r, depth $d, $t threads" >&2
      if ! /usr/bin/time -f "maxrss_kb %M" "$BIN/llama-bench" -m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -d "$d" -fa 1 \
           -t "$t" -r "$REPS" -o md "${kv[@]}" > "$log" 2>&1; then
        echo "[speed] $r failed, see $log" >&2
        continue
      fi
      # llama-bench names a test "pp512 @ d4096", or "pp512" at depth 0.
      at=" @ d$d"
      [ "$d" = 0 ] && at=""
      pp=$(grep -E "\| +pp$N_PROMPT$at +\|" "$log" | awk -F'|' '{print $(NF-1)}' | xargs || true)
      tg=$(grep -E "\| +tg$N_GEN$at +\|" "$log" | awk -F'|' '{print $(NF-1)}' | xargs || true)
      rss=$(grep -oE "maxrss_kb [0-9]+" "$log" | awk '{printf "%.0f MiB", $2 / 1024}')
      printf "| %-24s | %6s | %7s | %-16s | %-16s | %9s |\n" "$r" "$d" "$t" "${pp:--}" "${tg:--}" "$rss"
    done
  done
done
