#!/usr/bin/env bash
# llama.cpp's KV-cache options measured with llama.cpp's own tool, `llama-perplexity
# --kl-divergence`, same tokens for every row: llama.cpp's types (q8_0, q5_0, q4_0: its Hadamard
# rotation of quantized caches is on by default), e8kv's E8 ggml types (e8r4, e8r3, e8p) and e8kv
# as llama.cpp's KV memory (`e8kv:SPEC` rows, --kv-e8kv SPEC). Flash attention on.
#
# Protocol (the same for every row, printed in the caption): chunks of CTX tokens, each evaluated
# in two llama_decode calls of CTX/2 tokens (-b = -ub = CTX/2). The first call is the prompt (e8kv:
# attended densely, then compressed); the scored second half is the second call, in which every
# token attends its predecessors as the cache holds them (llama.cpp's types: quantized, batch
# included; e8kv: appended and attended token by token, its fp16 window as in decoding).
# Bits per element: llama.cpp's types from their block layouts; e8kv rows from e8kv's bytes()
# over the run (codes, scales, windows, positions, headers), printed by the memory at exit.
#
#   scripts/llama-cpp-kv-types.sh [chunks (default 8)] [rows (default: llama.cpp's and e8kv's)]
#   E8KV_LLAMA_MODEL=NAME     a model of scripts/fetch-model.sh (smollm2, the default; gemma3;
#                             qwen2.5-coder-0.5b)
#   E8KV_CTX=2048             chunk length (default 512)
#   E8KV_LLAMA_TOOLS_BUILD    build directory (default build/llama-tools)
# Not part of CI: CI runs the same protocol, 2 chunks and two presets, through the API with KL
# bounds (llama_cpp_memory_test, PerplexityProtocolKlWithinBounds).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
CHUNKS="${1:-8}"
ROWS="${2:-q8_0 q5_0 q4_0 e8kv:preset=quant-k4v4 e8kv:preset=tier-k3v2 e8kv:preset=quant-k3v2 e8kv:preset=tier-k2v2}"
CTX="${E8KV_CTX:-512}"
BIN="$(bash "$E8KV_ROOT/scripts/build-llama-cpp.sh" llama-perplexity)"
PPL="$BIN/llama-perplexity"
BUILD="$(dirname "$BIN")"
MODEL_NAME="${E8KV_LLAMA_MODEL:-smollm2}"
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "$MODEL_NAME")"
TEXT_DIR="$(dirname "$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | head -1)")"

# Both corpora of the real-model evaluation, one after the other (docs/accuracy.md's texts).
TEXT="$BUILD/corpus.txt"
cat "$TEXT_DIR"/fiction.txt "$TEXT_DIR"/tech.txt > "$TEXT"
BASE="$BUILD/$MODEL_NAME-$CTX-f16.kld"
common=(-m "$MODEL" -f "$TEXT" -c "$CTX" -b $((CTX / 2)) -ub $((CTX / 2)) --chunks "$CHUNKS" -fa on -t "$E8KV_JOBS")
echo "[kv-types] f16 base logits: $MODEL_NAME, $CHUNKS chunks of $CTX tokens" >&2
"$PPL" "${common[@]}" -ctk f16 -ctv f16 --kl-divergence-base "$BASE" > "$BUILD/$MODEL_NAME-$CTX-f16.log" 2>&1
ppl_f16=$(grep -oE "Final estimate: PPL = [0-9.]+" "$BUILD/$MODEL_NAME-$CTX-f16.log" | grep -oE "[0-9.]+$")
echo "llama-perplexity --kl-divergence, $MODEL_NAME, $CHUNKS chunks x $CTX tokens, -b $((CTX / 2)) -ub $((CTX / 2)) -fa on -t $E8KV_JOBS (second half of each chunk scored)"
printf "| %-24s | %6s | %-20s | %-20s | %8s |\n" "KV cache" bits "mean KL" "PPL" "max RSS"
printf "|%s|%s|%s|%s|%s|\n" "--------------------------" "--------" "----------------------" "----------------------" "----------"
printf "| %-24s | %6s | %-20s | %-20s | %8s |\n" f16 16 0 "$ppl_f16" ""
for r in $ROWS; do
  name="${r//[:=,]/_}"
  log="$BUILD/$MODEL_NAME-$CTX-$name.log"
  case "$r" in
    e8kv:*) kv=(--kv-e8kv "${r#e8kv:}") ;;
    *) kv=(-ctk "$r" -ctv "$r") ;;
  esac
  if ! /usr/bin/time -f "maxrss_kb %M" "$PPL" "${common[@]}" "${kv[@]}" --kl-divergence-base "$BASE" --kl-divergence \
       > "$log" 2>&1; then
    echo "[kv-types] $r failed, see $log" >&2
    continue
  fi
  kl=$(grep -E "^Mean +KLD:" "$log" | awk '{print $3, $4, $5}')
  ppl=$(grep -E "^Mean PPL\(Q\) +:" "$log" | awk '{print $4, $5, $6}')
  rss=$(grep -oE "maxrss_kb [0-9]+" "$log" | awk '{printf "%.0f MiB", $2 / 1024}')
  case "$r" in
    q8_0) bits=8.5 ;; q5_0) bits=5.5 ;; q4_1) bits=5.0 ;; q4_0) bits=4.5 ;;
    e8r4) bits=4.25 ;; e8r3) bits=3.25 ;; e8p) bits=2.25 ;;
    e8kv:*) bits=$(grep -oE "bits per element over the run: [0-9.]+" "$log" | grep -oE "[0-9.]+$" || echo "?") ;;
    *) bits="?" ;;
  esac
  printf "| %-24s | %6s | %-20s | %-20s | %8s |\n" "$r" "$bits" "$kl" "$ppl" "$rss"
  # Models with several layer groups (Gemma-3: sliding-window and global layers) log each group's
  # bits per element given: the window layers hold only their window.
  case "$r" in
    e8kv:*) grep -oE "; layers [^;)]*\)[^;)]*: [0-9.]+ bits per element given" "$log" | sed 's/^; /    /' >&2 || true ;;
  esac
done
