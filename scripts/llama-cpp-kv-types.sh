#!/usr/bin/env bash
# llama.cpp's KV-cache types, e8kv's E8 types among them, measured with llama.cpp's own tool:
# `llama-perplexity --kl-divergence` on SmolLM2-135M (or E8KV_LLAMA_MODEL), whole run in memory (the prefill and every
# scored token attend over the quantized cache), flash attention on, same tokens for every type.
# Prints one row per type: bits/value of the cache, mean KL against the f16 cache, perplexity.
# Not part of CI: it builds llama.cpp's tools from the patched tree (a few minutes on 2 cores).
#
#   scripts/llama-cpp-kv-types.sh [chunks (default 8)] [types (default "q8_0 q5_0 q4_1 q4_0 e8r4 e8r3 e8p")]
#   E8KV_LLAMA_TOOLS_BUILD=dir   build directory (default build/llama-tools)
#   E8KV_LLAMA_MODEL=gemma3      Gemma-3-270M instead of SmolLM2 (scripts/fetch-model.sh names)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
CHUNKS="${1:-8}"
TYPES="${2:-q8_0 q5_0 q4_1 q4_0 e8r4 e8r3 e8p}"
bash "$E8KV_ROOT/scripts/setup.sh"
SRC="$(bash "$E8KV_ROOT/scripts/fetch-llama-cpp.sh")"
MODEL_NAME="${E8KV_LLAMA_MODEL:-smollm2}"
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "$MODEL_NAME")"
TEXT_DIR="$(dirname "$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | head -1)")"
BUILD="${E8KV_LLAMA_TOOLS_BUILD:-$E8KV_ROOT/build/llama-tools}"

cmake -S "$SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
      -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
      -DGGML_E8KV_SOURCE="$E8KV_ROOT/integrations/llama.cpp/ggml/ggml-e8kv.cpp" \
      -DGGML_E8KV_INCLUDE_DIR="$E8KV_ROOT/include" >/dev/null
cmake --build "$BUILD" -j "$E8KV_JOBS" --target llama-perplexity >/dev/null
PPL="$BUILD/bin/llama-perplexity"

# Both corpora of the real-model evaluation, one after the other (docs/accuracy.md's texts).
TEXT="$BUILD/corpus.txt"
cat "$TEXT_DIR"/fiction.txt "$TEXT_DIR"/tech.txt > "$TEXT"
BASE="$BUILD/$MODEL_NAME-f16.kld"
common=(-m "$MODEL" -f "$TEXT" -c 512 -b 512 --chunks "$CHUNKS" -fa on -t "$E8KV_JOBS")
echo "[kv-types] f16 base logits: $CHUNKS chunks of 512 tokens" >&2
"$PPL" "${common[@]}" -ctk f16 -ctv f16 --kl-divergence-base "$BASE" > "$BUILD/$MODEL_NAME-f16.log" 2>&1
ppl_f16=$(grep -oE "Final estimate: PPL = [0-9.]+" "$BUILD/$MODEL_NAME-f16.log" | grep -oE "[0-9.]+$")
printf "| %-6s | %5s | %-20s | %-20s |\n" type bits "mean KL" "PPL"
printf "| %-6s | %5s | %-20s | %-20s |\n" f16 16 0 "$ppl_f16"
for t in $TYPES; do
  log="$BUILD/$MODEL_NAME-$t.log"
  "$PPL" "${common[@]}" -ctk "$t" -ctv "$t" --kl-divergence-base "$BASE" --kl-divergence > "$log" 2>&1 ||
    { echo "[kv-types] $t failed, see $log" >&2; continue; }
  kl=$(grep -E "^Mean +KLD:" "$log" | awk '{print $3, $4, $5}')
  ppl=$(grep -E "^Mean PPL\(Q\) +:" "$log" | awk '{print $4, $5, $6}')
  case "$t" in
    q8_0) bits=8.5 ;; q5_0) bits=5.5 ;; q4_1) bits=5.0 ;; q4_0) bits=4.5 ;;
    e8r4) bits=4.25 ;; e8r3) bits=3.25 ;; e8p) bits=2.25 ;; *) bits="?" ;;
  esac
  printf "| %-6s | %5s | %-20s | %-20s |\n" "$t" "$bits" "$kl" "$ppl"
done
