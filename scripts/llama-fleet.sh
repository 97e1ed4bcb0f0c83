#!/usr/bin/env bash
# Two llama-servers and one Redis sharing a prompt's KV cache through e8kv, end to end:
#  1. starts redis-server on a Unix socket in a temp dir (no persistence) and two llama-servers
#     (A, B) on SmolLM2-135M, each with its own --slot-save-path;
#  2. A answers a prompt (greedy), saves slot 0, and `e8kv-llama-state push` compresses the slot
#     and publishes it under its token-prefix keys;
#  3. B tokenizes the prompt, `e8kv-llama-state pull` fetches the longest stored prefix and writes
#     a slot file; B restores it (/slots/0?action=restore) and the script checks the server's
#     n_restored equals the tokens pull reported (llama.cpp's restore can silently do nothing);
#  4. B answers the same prompt: the answer, the prompt tokens B reused from the restored slot and
#     the top-5 probabilities of the first generated token are compared with A's.
# Exits non-zero when any check fails. Not part of CI (needs a llama-server build).
#
#   scripts/llama-fleet.sh LLAMA_BIN_DIR [SPEC (default preset=quant-k3v2)] [PROMPT_CHARS (default 6000)]
#   LLAMA_BIN_DIR: the directory holding llama-server (e.g. build/llama-tools/bin).
#   E8KV_FLEET_CHUNK=256 tokens per key chunk; E8KV_LLAMA_MODEL=smollm2|gemma3;
#   E8KV_FLEET_STORE=unix (default) or tcp: Redis over its Unix socket or loopback TCP.
#   Time to first token per preset, repeated: bench/fleet_ttft.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
BIN_DIR="${1:?usage: scripts/llama-fleet.sh LLAMA_BIN_DIR [SPEC] [PROMPT_CHARS]}"
SPEC="${2:-preset=quant-k3v2}"
PROMPT_CHARS="${3:-6000}"
CHUNK="${E8KV_FLEET_CHUNK:-256}"
source "$E8KV_ROOT/scripts/fleet-common.sh"
fleet_init "$BIN_DIR" "${E8KV_LLAMA_MODEL:-smollm2}"
fleet_start_redis
STORE="$FLEET_REDIS_UNIX"
[ "${E8KV_FLEET_STORE:-unix}" = tcp ] && STORE="$FLEET_REDIS_TCP"
PA="${E8KV_FLEET_PORT:-18101}"; PB=$((PA + 1))
fleet_start_server a $PA
fleet_start_server b $PB
fleet_wait $PA $PB


TEXT="$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | grep fiction)"
python3 - "$TEXT" "$PROMPT_CHARS" > "$FLEET_DIR/body.json" <<'EOF'
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()[: int(sys.argv[2])]
print(json.dumps({"prompt": text, "n_predict": 16, "temperature": 0, "cache_prompt": True, "id_slot": 0,
                  "n_probs": 5, "samplers": ["top_k"], "top_k": 1}))
EOF

t0=$(date +%s.%N)
fleet_api $PA /completion "@$FLEET_DIR/body.json" > "$FLEET_DIR/answer-a.json"
t1=$(date +%s.%N)
fleet_api $PA "/slots/0?action=save" '{"filename": "slot.bin"}' > "$FLEET_DIR/save.json"
"$FLEET_TOOL" push --model "$FLEET_MODEL" --store "$STORE" --config "$SPEC" --chunk "$CHUNK" --ttl 3600 "$FLEET_DIR/a/slot.bin" | tee "$FLEET_DIR/push.txt"

python3 -c 'import json,sys; print(json.dumps({"content": json.load(open(sys.argv[1]))["prompt"], "add_special": True}))' "$FLEET_DIR/body.json" > "$FLEET_DIR/tok-req.json"
fleet_api $PB /tokenize "@$FLEET_DIR/tok-req.json" > "$FLEET_DIR/tokens.json"
t2=$(date +%s.%N)
set +e
"$FLEET_TOOL" pull --model "$FLEET_MODEL" --store "$STORE" --config "$SPEC" --chunk "$CHUNK" --tokens-file "$FLEET_DIR/tokens.json" \
  "$FLEET_DIR/b/pulled.bin" | tee "$FLEET_DIR/pull.txt"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" = 0 ] || { echo "[fleet] FAIL: pull missed (exit $rc)" >&2; exit 1; }
pulled=$(sed -n 's/^pull: restored \([0-9]*\) tokens.*/\1/p' "$FLEET_DIR/pull.txt")
fleet_api $PB "/slots/0?action=restore" '{"filename": "pulled.bin"}' > "$FLEET_DIR/restore.json"
t3=$(date +%s.%N)
n_restored=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["n_restored"])' "$FLEET_DIR/restore.json")
echo "[fleet] B restore: $(cat "$FLEET_DIR/restore.json")"
if [ "$n_restored" != "$pulled" ]; then
  echo "[fleet] FAIL: server B restored $n_restored tokens, pull wrote $pulled" >&2; exit 1
fi
fleet_api $PB /completion "@$FLEET_DIR/body.json" > "$FLEET_DIR/answer-b.json"
t4=$(date +%s.%N)
python3 - "$FLEET_DIR/answer-a.json" "$FLEET_DIR/answer-b.json" "$pulled" "$t0" "$t1" "$t2" "$t3" "$t4" "$SPEC" \
  "$E8KV_ROOT/bench" <<'EOF'
import json, sys
sys.path.insert(0, sys.argv[10])
from fleet_ttft import top5  # llama-server's first-token alternatives, in whichever form it lists them
a, b = (json.load(open(p)) for p in sys.argv[1:3])
pulled = int(sys.argv[3]); t0, t1, t2, t3, t4 = map(float, sys.argv[4:9]); spec = sys.argv[9]
def top(d):
    return [(tok, round(p, 4)) for tok, p in top5(d)]
ca = a.get("tokens_cached", a.get("timings", {}).get("cache_n")); cb = b.get("tokens_cached", b.get("timings", {}).get("cache_n"))
print(f"[fleet] A (prefill):  {a['content']!r}  prompt {a['timings']['prompt_n']} tokens evaluated, {(t1 - t0) * 1000:.0f} ms")
print(f"[fleet] B (restored): {b['content']!r}  prompt {b['timings']['prompt_n']} tokens evaluated, reused {cb}; "
      f"pull+restore {(t3 - t2) * 1000:.0f} ms + completion {(t4 - t3) * 1000:.0f} ms")
print(f"[fleet] first token top-5, A: {top(a)}")
print(f"[fleet] first token top-5, B: {top(b)}")
ok = True
if b["timings"]["prompt_n"] > a["timings"]["prompt_n"] - pulled + 1:
    print(f"[fleet] FAIL: B evaluated {b['timings']['prompt_n']} prompt tokens; the restored {pulled} were not reused"); ok = False
ta, tb = top(a), top(b)
if not ta or not tb:
    print("[fleet] FAIL: the server listed no first-token probabilities (n_probs)"); ok = False
elif ta[0][0] != tb[0][0]:
    print("[fleet] FAIL: the first token differs"); ok = False
if spec == "preset=lossless" and ta != tb:
    print("[fleet] FAIL: lossless restore but the probabilities differ"); ok = False
print("[fleet] OK" if ok else "[fleet] FAILED")
sys.exit(0 if ok else 1)
EOF
