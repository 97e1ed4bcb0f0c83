#!/usr/bin/env bash
# The load and fault harness's short form (bench/server_load.sh --short) against the llama-server
# built in the engine tree, with --kv-e8kv preset=quant-k3v2: 48 requests from 8 client streams on
# -np 4 (chats reusing their prefix, disconnects, over-long prompts, slot 0 saved / erased /
# restored while the others decode), then the saved slot restored on a restarted server. Fails
# when a check fails: a crash, an answer served alone that differs from the reference, an error
# the client cannot read, a restored conversation that differs (the harness's verdict).
#   server_load_test.sh BIN_DIR [rows]   (exit 77, skipped, without the model and texts; their
#                                         absence fails instead under E8KV_REQUIRE_DATA=1, as in CI)
set -euo pipefail
BIN="$1"; shift
ROWS=("${@:-e8kv:preset=quant-k3v2}")
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CACHE="${E8KV_CACHE:-$HOME/.cache/e8kv}"
for f in "$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$CACHE/text/tech.txt" "$CACHE/text/fiction.txt"; do
  if [ ! -f "$f" ]; then
    [ "${E8KV_REQUIRE_DATA:-}" = 1 ] && { echo "FAIL: $f absent and E8KV_REQUIRE_DATA=1" >&2; exit 1; }
    echo "$f absent (scripts/fetch-data.sh): skipped"; exit 77
  fi
done
[ -x "$BIN/llama-server" ] || { echo "FAIL: no llama-server in $BIN" >&2; exit 1; }
OUT="$(mktemp -d /tmp/server-load-test.XXXXXX)"
# The logs stay for a failure's post-mortem; a pass removes them.
if E8KV_LLAMA_BIN="$BIN" E8KV_LOAD_OUT="$OUT" bash "$ROOT/bench/server_load.sh" --short "${ROWS[@]}"; then
  rm -rf "$OUT"
else
  echo "FAIL: the harness's verdict (logs kept in $OUT)" >&2
  exit 1
fi
