#!/usr/bin/env bash
# Time to first token with the Redis store behind a link of set bandwidth (issue 48): on one
# machine the store is otherwise a loopback away, which hides what e8kv's smaller values buy.
# Redis runs in a network namespace behind a veth pair shaped by tc (scripts/netns-link.sh; root);
# the servers, the tool and bench/fleet_ttft.py stay on the host and reach it over the veth only.
# For each link (a bare-veth "none" pass first, for comparison, then E8KV_FLEET_LINKS), the link is
# set and measured (RTT, 64 MiB SET and GET goodput), then bench/fleet_ttft.py's rows are measured
# over TCP: raw f16 slot, e8kv-compressed f16 slot per E8KV_FLEET_SPECS, and, with
# E8KV_FLEET_MEMORY_SPECS, e8kv-memory slots from servers started with --kv-e8kv. A's prefill, the
# pushes (over the store's Unix socket, untimed) and the recompute row (no network) happen once.
#
#   bench/fleet_link.sh LLAMA_BIN_DIR [PREFIX_TOKENS (default 4096)] [REPS (default 3)]
#   E8KV_FLEET_LINKS="10gbit 1gbit 100mbit"  tc rates, after the "none" pass
#   E8KV_FLEET_RTT_MS=0.5                    round trip, half each way (netem; a kernel without
#                                            netem gets the rate only: scripts/netns-link.sh)
#   E8KV_FLEET_SPECS, E8KV_FLEET_CHUNK       as bench/fleet_ttft.sh (E8KV_FLEET_SPECS set but
#                                            empty: no compressed-f16 rows)
#   E8KV_FLEET_MEMORY_SPECS="preset=quant-k3v2;preset=tier-k3v2"
#                                            a pair of --kv-e8kv servers per spec and their rows
#                                            (unset: none; needs push/pull --kv-e8kv in the tool)
#   E8KV_FLEET_PORT=18131                    A; B is +1, the memory pairs +2, +3, ...
#   FLEET_CTX                                the servers' context (default max(8192, PREFIX + 2048))
#   E8KV_FLEET_TIMEOUT=7200                  seconds for the measuring; then everything is stopped
#   E8KV_LLAMA_MODEL=smollm2                 scripts/fetch-model.sh's name; llama-server caps a slot at
#                                            the model's training context (SmolLM2: 8,192), so a 16K
#                                            prefix needs qwen2.5-coder-0.5b (32K)
#   E8KV_FLEET_KL_SUFFIXES=16                next tokens of the KL pass (each recomputes the prefix
#                                            on B; 0: no KL pass, for long prefixes)
# Everything it starts (namespace, veth, redis, servers) is removed on exit, error or signal.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/env.sh"
BIN_DIR="${1:?usage: bench/fleet_link.sh LLAMA_BIN_DIR [PREFIX_TOKENS] [REPS]}"
PREFIX="${2:-4096}"
REPS="${3:-3}"
RTT="${E8KV_FLEET_RTT_MS:-0.5}"
LINKS="none"
for l in ${E8KV_FLEET_LINKS:-10gbit 1gbit 100mbit}; do [ "$l" = none ] || LINKS+=" $l"; done
source "$E8KV_ROOT/scripts/fleet-common.sh"
source "$E8KV_ROOT/scripts/netns-link.sh"

link_up   # first: refuses (exit 2) before anything starts when not root
fleet_init "$BIN_DIR" "${E8KV_LLAMA_MODEL:-smollm2}"
link_start_redis
FLEET_CTX="${FLEET_CTX:-$(( PREFIX + 2048 > 8192 ? PREFIX + 2048 : 8192 ))}"
PA="${E8KV_FLEET_PORT:-18131}"; PB=$((PA + 1))
fleet_start_server a "$PA"
fleet_start_server b "$PB"
PORTS=("$PA" "$PB")
MEMORY=()
IFS=';' read -ra MEMORY_SPECS <<< "${E8KV_FLEET_MEMORY_SPECS:-}"
i=0
for spec in "${MEMORY_SPECS[@]}"; do
  [ -n "$spec" ] || continue
  pa=$((PA + 2 + 2 * i)); pb=$((pa + 1))
  fleet_start_server "ma$i" "$pa" --kv-e8kv "$spec"
  fleet_start_server "mb$i" "$pb" --kv-e8kv "$spec"
  PORTS+=("$pa" "$pb")
  MEMORY+=(--memory "$spec@$pa,$pb,$FLEET_DIR/ma$i,$FLEET_DIR/mb$i")
  i=$((i + 1))
done
fleet_wait "${PORTS[@]}"
TEXT="$(bash "$E8KV_ROOT/scripts/fetch-text.sh" | grep fiction)"
# fleet_ttft.py runs `$HOOK RATE` before each link's rows: link_set, then link_measure.
printf -v HOOK '%q ' bash "$E8KV_ROOT/scripts/netns-link.sh" hook "$LINK_ID" "$RTT"
echo "[link] redis in namespace $LINK_NS at $LINK_REDIS_TCP; servers: ${PORTS[*]} (context $FLEET_CTX);" \
     "links: $LINKS; RTT $RTT ms"
timeout --foreground -k 30 "${E8KV_FLEET_TIMEOUT:-7200}" \
  python3 "$E8KV_ROOT/bench/fleet_ttft.py" --a "$PA" --b "$PB" --a-slots "$FLEET_DIR/a" --b-slots "$FLEET_DIR/b" \
  --unix "$LINK_REDIS_UNIX" --tcp "$LINK_REDIS_TCP" --transports tcp --links "$LINKS" --link-cmd "$HOOK" \
  --tool "$FLEET_TOOL" --model "$FLEET_MODEL" --text "$TEXT" --prefix "$PREFIX" --reps "$REPS" \
  --kl-suffixes "${E8KV_FLEET_KL_SUFFIXES:-16}" \
  --chunk "${E8KV_FLEET_CHUNK:-256}" ${E8KV_FLEET_SPECS+--specs "$E8KV_FLEET_SPECS"} "${MEMORY[@]}"
