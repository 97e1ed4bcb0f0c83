#!/usr/bin/env bash
# e8kv-llama-state push | pull through a real redis-server (run under tests/store/with_redis.sh)
# with the real SmolLM2 GGUF (its fingerprint and shape) and a synthetic slot file of that shape:
# a lossless push/pull gives the slot back byte for byte, a prompt sharing one chunk restores that
# chunk, a foreign prompt misses (exit 3), a quantized preset's keys do not see lossless entries,
# a store that is down fails fast with exit 1 and a message naming it, and a Redis that wants a
# password is refused without one and used with E8KV_STORE_PASSWORD (database 2).
#   fleet_cli_test.sh TOOL [MODEL.gguf]   (exit 77, skipped, without the model or redis; a missing
#                                          model fails instead under E8KV_REQUIRE_DATA=1, as in CI)
set -euo pipefail
TOOL="$1"
MODEL="${2:-${E8KV_CACHE:-$HOME/.cache/e8kv}/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ ! -f "$MODEL" ]; then
  [ "${E8KV_REQUIRE_DATA:-}" = 1 ] && { echo "FAIL: model $MODEL absent and E8KV_REQUIRE_DATA=1" >&2; exit 1; }
  echo "model $MODEL absent (scripts/fetch-data.sh): skipped"; exit 77
fi
[ -n "${E8KV_TEST_REDIS_UNIX:-}" ] || { echo "no redis (run under tests/store/with_redis.sh): skipped"; exit 77; }
W="$(mktemp -d)"; trap '[ -f "$W/auth.pid" ] && kill "$(cat "$W/auth.pid")" 2>/dev/null; rm -rf "$W"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# SmolLM2-135M: 30 layers, 3 KV heads x 64, f16 K rows and transposed V (flash attention off).
python3 - "$W" <<'EOF'
import random, struct, sys
w = sys.argv[1]
def slot(tokens, seed, path):
    r = random.Random(seed); n = len(tokens); embd = 3 * 64
    b = bytearray(struct.pack("<III", 0x67677371, 3, n)); b += struct.pack(f"<{n}i", *tokens)
    b += struct.pack("<II", 1, n)                      # n_stream, cell_count
    for p in range(n): b += struct.pack("<iIi", p, 1, 0)  # pos, n_seq_id, seq id
    b += struct.pack("<II", 1, 30)                     # v_trans, n_layer
    def row(k):  # fp16 Gaussian-ish values, keys with a channel bias
        return struct.pack(f"<{k}e", *[(0.7 if i % 7 == 0 else 0.0) + r.gauss(0, 1) for i in range(k)])
    for l in range(30): b += struct.pack("<iQ", 1, embd * 2) + row(n * embd)
    for l in range(30): b += struct.pack("<iII", 1, 2, embd) + row(n * embd)
    open(path, "wb").write(b)
t = [random.Random(1).randrange(1, 49000) for _ in range(512)]
slot(t, 2, f"{w}/slot.bin")
open(f"{w}/same.txt", "w").write(",".join(map(str, t + [5, 6, 7])))
open(f"{w}/one.txt", "w").write(",".join(map(str, t[:256] + [9] * 300)))
open(f"{w}/other.txt", "w").write(",".join(map(str, [3] * 600)))
EOF
S="$E8KV_TEST_REDIS_UNIX"
"$TOOL" push --model "$MODEL" --store "$S" --config preset=lossless --ttl 60 "$W/slot.bin" | tee "$W/push.txt"
grep -q "512 of 512 tokens published" "$W/push.txt" || fail "push did not publish 512 tokens"
"$TOOL" pull --model "$MODEL" --store "$S" --config preset=lossless --tokens-file "$W/same.txt" "$W/pulled.bin"
cmp "$W/slot.bin" "$W/pulled.bin" || fail "lossless pull differs from the pushed slot"
"$TOOL" pull --model "$MODEL" --store "$S" --config preset=lossless --tokens-file "$W/one.txt" "$W/one.bin" \
  | grep -q "restored 256 tokens" || fail "one shared chunk: not 256 tokens restored"
rc=0; "$TOOL" pull --model "$MODEL" --store "$S" --config preset=lossless --tokens-file "$W/other.txt" "$W/x.bin" || rc=$?
[ "$rc" = 3 ] || fail "foreign prompt: exit $rc, expected 3 (miss)"
rc=0; "$TOOL" pull --model "$MODEL" --store "$S" --config preset=quant-k3v2 --tokens-file "$W/same.txt" "$W/x.bin" || rc=$?
[ "$rc" = 3 ] || fail "another preset: exit $rc, expected 3 (its keys differ)"
"$TOOL" push --model "$MODEL" --store "$S" --config preset=quant-k3v2 "$W/slot.bin" | grep -q "512 of 512" || fail "k3v2 push"
"$TOOL" pull --model "$MODEL" --store "$S" --config preset=quant-k3v2 --tokens-file "$W/same.txt" "$W/k3.bin" \
  | grep -q "restored 512 tokens" || fail "k3v2 pull"
[ "$(stat -c %s "$W/k3.bin")" = "$(stat -c %s "$W/slot.bin")" ] || fail "k3v2 slot size differs"
start=$(date +%s%N); rc=0
"$TOOL" pull --model "$MODEL" --store "unix://$W/none.sock" --tokens-file "$W/same.txt" "$W/x.bin" 2> "$W/err.txt" || rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$rc" = 1 ] || fail "store down: exit $rc, expected 1"
grep -q "cannot connect" "$W/err.txt" || fail "store down: message '$(cat "$W/err.txt")'"
echo "store down: exit 1 after ${ms} ms: $(cat "$W/err.txt")"

# A fleet's Redis with a password (the same redis-server binary with_redis.sh started).
"${E8KV_TEST_REDIS_SERVER:-redis-server}" --port 0 --unixsocket "$W/auth.sock" --save '' --appendonly no --dir "$W" \
  --requirepass fleet-pw --daemonize yes --pidfile "$W/auth.pid" --logfile "$W/auth.log"
for _ in $(seq 1 100); do [ -S "$W/auth.sock" ] && break; sleep 0.05; done
A="unix://$W/auth.sock?db=2"
rc=0; "$TOOL" push --model "$MODEL" --store "$A" --config preset=quant-k3v2 "$W/slot.bin" 2> "$W/err.txt" || rc=$?
[ "$rc" = 1 ] || fail "no password: exit $rc, expected 1"
grep -q "NOAUTH" "$W/err.txt" || fail "no password: message '$(cat "$W/err.txt")'"
E8KV_STORE_PASSWORD=fleet-pw "$TOOL" push --model "$MODEL" --store "$A" --config preset=quant-k3v2 "$W/slot.bin" \
  | grep -q "512 of 512" || fail "push with E8KV_STORE_PASSWORD"
E8KV_STORE_PASSWORD=fleet-pw "$TOOL" pull --model "$MODEL" --store "$A" --config preset=quant-k3v2 \
  --tokens-file "$W/same.txt" "$W/auth.bin" | grep -q "restored 512 tokens" || fail "pull with E8KV_STORE_PASSWORD"
cmp "$W/k3.bin" "$W/auth.bin" || fail "the password-protected store gave another slot"
rc=0; E8KV_STORE_PASSWORD=fleet-pw "$TOOL" pull --model "$MODEL" --store "unix://$W/auth.sock" --config preset=quant-k3v2 \
  --tokens-file "$W/same.txt" "$W/x.bin" || rc=$?
[ "$rc" = 3 ] || fail "database 0 of the password-protected store: exit $rc, expected 3 (pushed to database 2)"
echo "OK"
