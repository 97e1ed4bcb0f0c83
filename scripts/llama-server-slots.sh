#!/usr/bin/env bash
# A llama-server slot through e8kv, end to end: builds llama-server from the fetched llama.cpp
# tree (e8kv's patch adds only KV types; the slot code is llama.cpp's own), starts it on
# SmolLM2-135M (or E8KV_LLAMA_MODEL) with --slot-save-path, runs a prompt, saves slot 0, compresses the slot file with
# e8kv-llama-state, restores it into the slot directory and has the server restore and continue
# from it. Prints the file sizes and the server's answers. Not part of CI (builds llama-server).
#
#   scripts/llama-server-slots.sh [config spec (default preset=quant-k3v2)] [N]
#   N: the prompt is the first N characters of the fiction corpus (scripts/fetch-text.sh) instead
#      of the short built-in one: a long conversation's slot (N=7000 is ~1,700 SmolLM2 tokens)
#   E8KV_LLAMA_TOOLS_BUILD=dir   llama.cpp build directory (default build/llama-tools)
#   E8KV_LLAMA_MODEL=gemma3      Gemma-3-270M instead of SmolLM2 (scripts/fetch-model.sh names)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
SPEC="${1:-preset=quant-k3v2}"
PROMPT_CHARS="${2:-}"
bash "$E8KV_ROOT/scripts/setup.sh"
MODEL_NAME="${E8KV_LLAMA_MODEL:-smollm2}"
MODEL="$(bash "$E8KV_ROOT/scripts/fetch-model.sh" "$MODEL_NAME")"
BUILD="$(dirname "$(bash "$E8KV_ROOT/scripts/build-llama-cpp.sh" llama-server)")"
E8KV_TARGETS=(e8kv-llama-state)
configure_and_build >/dev/null
TOOL="$E8KV_BUILD/integrations/llama.cpp/e8kv-llama-state"

SLOTS="$(mktemp -d)"
PORT="${E8KV_SERVER_PORT:-18089}"
"$BUILD/bin/llama-server" -m "$MODEL" -c 2048 -np 1 -fa on -t "$E8KV_JOBS" --port "$PORT" \
  --slot-save-path "$SLOTS/" > "$SLOTS/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; rm -rf "$SLOTS"' EXIT
for _ in $(seq 1 60); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
api() { curl -sf -X POST "http://127.0.0.1:$PORT$1" -H 'Content-Type: application/json' -d "$2"; }

PROMPT="The lighthouse keeper wrote in his log every evening. On the first of March the wind came from the north-east and the sea was grey. Two fishing boats returned late, and the younger captain, whose name was Elena Brandt, said the nets had caught almost nothing but weed. The keeper noted the barometer at 1012 hectopascals, falling slowly. In the morning he repaired the lamp's clockwork, which had lost eleven minutes overnight. Question: what was the younger captain's name? Answer:"
if [ -n "$PROMPT_CHARS" ]; then
  TEXT="$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | grep fiction)"
  PROMPT="$(python3 -c 'import sys; print(open(sys.argv[1], encoding="utf-8").read()[:int(sys.argv[2])])' "$TEXT" "$PROMPT_CHARS")"
fi
body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "n_predict": 8, "temperature": 0, "cache_prompt": True, "id_slot": 0}))' "$PROMPT")
echo "[slots] first answer: $(api /completion "$body" | python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["content"]))')"
api "/slots/0?action=save" '{"filename": "slot.bin"}' >/dev/null
"$TOOL" compress --model "$MODEL" --config "$SPEC" "$SLOTS/slot.bin" "$SLOTS/slot.e8kv"
"$TOOL" restore "$SLOTS/slot.e8kv" "$SLOTS/restored.bin"
ls -l "$SLOTS"/slot.bin "$SLOTS"/slot.e8kv "$SLOTS"/restored.bin | awk '{print "[slots] " $5 " bytes  " $NF}'
api "/slots/0?action=erase" '{}' >/dev/null
echo "[slots] restore: $(api "/slots/0?action=restore" '{"filename": "restored.bin"}')"
answer=$(api /completion "$body")
echo "[slots] answer after restore: $(echo "$answer" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(repr(d["content"]), "prompt tokens reused from the restored slot:", d["tokens_cached"] if "tokens_cached" in d else d.get("timings", {}).get("cache_n"))')"
