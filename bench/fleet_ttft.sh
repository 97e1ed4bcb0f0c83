#!/usr/bin/env bash
# Time to first token for a repeated long prefix on a second llama-server (bench/fleet_ttft.py
# says the protocol): recompute the prefill, or restore the prefix's KV cache from Redis: the raw
# slot file, or e8kv's value per preset, over Redis's Unix socket and loopback TCP. Starts its own
# redis-server (no persistence) and two plain llama-servers (f16 cache) on SmolLM2; stops them.
#
#   bench/fleet_ttft.sh LLAMA_BIN_DIR [PREFIX_TOKENS (default 4096)] [REPS (default 3)]
#   E8KV_FLEET_SPECS="preset=quant-k3v2;..." the e8kv rows (default quant-k3v2, tier-k3v2 with
#   scorer=key-key, quant-k4v4); E8KV_FLEET_CHUNK=256 tokens per key chunk.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
BIN_DIR="${1:?usage: bench/fleet_ttft.sh LLAMA_BIN_DIR [PREFIX_TOKENS] [REPS]}"
source "$E8KV_ROOT/scripts/fleet-common.sh"
fleet_init "$BIN_DIR"
fleet_start_redis
PA="${E8KV_FLEET_PORT:-18121}"; PB=$((PA + 1))
fleet_start_server a $PA
fleet_start_server b $PB
fleet_wait $PA $PB
TEXT="$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | grep fiction)"
python3 "$E8KV_ROOT/bench/fleet_ttft.py" --a $PA --b $PB --a-slots "$FLEET_DIR/a" --b-slots "$FLEET_DIR/b" \
  --unix "$FLEET_REDIS_UNIX" --tcp "$FLEET_REDIS_TCP" --tool "$FLEET_TOOL" --model "$FLEET_MODEL" --text "$TEXT" \
  --prefix "${2:-4096}" --reps "${3:-3}" --chunk "${E8KV_FLEET_CHUNK:-256}" \
  ${E8KV_FLEET_SPECS:+--specs "$E8KV_FLEET_SPECS"}
