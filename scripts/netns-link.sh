# A network link of set bandwidth and latency on this machine, for benchmarks that must not see
# loopback speeds (issue 48): a network namespace joined to the host by a veth pair, shaped with
# tc on both ends. Only private addresses on the veth itself (a /30: no route leads anywhere else;
# the namespace has no default route). Needs root (ip netns, tc); iproute2 only.
# Kernels built without sch_netem (this 2-core VM's 6.18: only tbf, htb and the fifos) get the
# rate alone, from tbf: no delay is added and the RTT stays the bare veth's (~0.03-0.08 ms);
# link_set says so in LINK_SHAPED, and link_measure prints the RTT it sees.
#
# Sourced (after env.sh):
#   link_up             netns e8kv-link-$LINK_ID (LINK_ID defaults to this shell's pid), veth
#                       e8kvh$LINK_ID (host, $LINK_HOST_ADDR) <-> e8kvn$LINK_ID (namespace,
#                       $LINK_NS_ADDR), both up; starts nothing. Registers link_down on EXIT,
#                       before any EXIT trap already there (fleet-common.sh's fleet_cleanup), and
#                       makes INT/TERM/HUP exit so the EXIT trap runs. Exits 2 when not root, when
#                       the addresses are taken (a leftover namespace) or when `ip netns add` fails.
#   link_set RATE [RTT_MS]  (re)applies the shaping: each direction gets RATE and RTT_MS/2 of
#                       delay (RTT_MS default $LINK_RTT_MS, 0.5; without netem: see above). RATE:
#                       tc's form (10gbit, 1gbit, 100mbit); `none` removes the shaping (a bare
#                       veth pair). Sets LINK_SHAPED: what was applied, in words.
#   link_exec CMD...    runs CMD inside the namespace.
#   link_start_redis    redis-server inside the namespace on $LINK_NS_ADDR:6379 only (and a Unix
#                       socket in the link's temp dir, for untimed setup traffic: Unix sockets live
#                       in the file system, not in a network namespace), no persistence; sets
#                       LINK_REDIS_TCP and LINK_REDIS_UNIX; waits until it answers.
#   link_measure [LABEL]  prints the link's figures from the host side: the median of 20 PINGs
#                       over one connection, and the goodput of one SET and one GET of a 64 MiB
#                       value (each timed to Redis's reply: a request's whole time).
#   link_down           kills what runs in the namespace, deletes the veth pair and the namespace,
#                       removes the temp dir. Idempotent.
#
# Executed: `bash scripts/netns-link.sh hook LINK_ID RTT_MS RATE` = link_set RATE RTT_MS then
# link_measure, on the link a sourcing shell brought up with that LINK_ID (bench/fleet_ttft.py's
# --link-cmd: it appends RATE).

LINK_ID="${LINK_ID:-$$}"
LINK_NS="e8kv-link-$LINK_ID"
LINK_IF_HOST="e8kvh$LINK_ID"   # interface names: 15 characters at most
LINK_IF_NS="e8kvn$LINK_ID"
LINK_HOST_ADDR="${LINK_HOST_ADDR:-10.254.77.1}"
LINK_NS_ADDR="${LINK_NS_ADDR:-10.254.77.2}"
LINK_RTT_MS="${LINK_RTT_MS:-0.5}"
LINK_REDIS_TCP="redis://$LINK_NS_ADDR:6379"
LINK_DIR="${LINK_DIR:-}"
LINK_REDIS_PID=""
LINK_SHAPED=""

link_up() {
  [ "$(id -u)" = 0 ] || { echo "[link] error: a shaped link needs root (ip netns, tc)" >&2; exit 2; }
  if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "[link] error: ip and tc (iproute2) are needed" >&2; exit 2
  fi
  if ip -o addr show | grep -q " inet $LINK_HOST_ADDR/"; then
    echo "[link] error: $LINK_HOST_ADDR is already on an interface (a leftover link? \`ip netns list\`;" \
         "\`ip netns pids NS | xargs -r kill; ip netns del NS\` removes one)" >&2
    exit 2
  fi
  local err
  if ! err="$(ip netns add "$LINK_NS" 2>&1)"; then
    echo "[link] error: ip netns add $LINK_NS failed: $err" >&2
    exit 2
  fi
  LINK_DIR="$(mktemp -d)"
  _link_on_exit link_down
  trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
  ip link add "$LINK_IF_HOST" type veth peer name "$LINK_IF_NS" netns "$LINK_NS"
  ip addr add "$LINK_HOST_ADDR/30" dev "$LINK_IF_HOST"
  ip link set "$LINK_IF_HOST" up
  link_exec ip addr add "$LINK_NS_ADDR/30" dev "$LINK_IF_NS"
  link_exec ip link set "$LINK_IF_NS" up
  link_exec ip link set lo up
}

# Runs $1 at exit, before the EXIT trap already set (bash keeps one trap per signal).
_link_on_exit() {
  local prev=()
  eval "prev=($(trap -p EXIT))"   # trap -- 'CMD' EXIT
  # shellcheck disable=SC2064  # expanded now on purpose: the commands, not the variables
  trap "$1${prev[2]:+; ${prev[2]}}" EXIT
}

link_exec() { ip netns exec "$LINK_NS" "$@"; }

# RATE (tc's form) in bit/s, or nothing when it is not one.
_link_bits() {
  awk -v rate="$1" 'BEGIN {
    n = rate + 0; u = tolower(rate); sub(/^[0-9.]+/, "", u)
    m = (u == "bit") ? 1 : (u == "kbit") ? 1e3 : (u == "mbit") ? 1e6 : (u == "gbit") ? 1e9 : -1
    if (m > 0 && n > 0) printf "%.0f\n", n * m }'
}

# Both ends: netem (delay and rate) where the kernel has it; else tbf, rate only. The queue holds
# what a sender can have queued: TCP's small-queue limit per socket (tcp_limit_output_bytes, 4 MiB
# on this kernel) plus a bandwidth-delay product or four, so no loss comes from the queue and TCP
# sees the rate, not drops (netem's limit counts packets: sized for 1,500-byte ones). tbf's burst:
# 1 ms of the rate, at least one 64 KiB GSO packet (smaller ones are split first, in software).
# Sets LINK_SHAPED to what was applied, for the record.
link_set() {
  local rate="${1:?usage: link_set RATE|none [RTT_MS]}" rtt="${2:-$LINK_RTT_MS}" bits delay bytes err dev
  if [ "$rate" = none ]; then
    tc qdisc del dev "$LINK_IF_HOST" root 2>/dev/null || true
    link_exec tc qdisc del dev "$LINK_IF_NS" root 2>/dev/null || true
    LINK_SHAPED="none (bare veth)"
    return 0
  fi
  bits="$(_link_bits "$rate")"
  [ -n "$bits" ] || { echo "[link] error: rate '$rate': want N bit|kbit|mbit|gbit, or none" >&2; return 2; }
  delay="$(awk -v r="$rtt" 'BEGIN { printf "%gms", r / 2 }')"
  bytes="$(awk -v b="$bits" -v r="$rtt" 'BEGIN { printf "%.0f", 4 * b / 8 * r / 1000 + 8 * 1048576 }')"
  if err="$(tc qdisc replace dev "$LINK_IF_HOST" root netem delay "$delay" rate "$rate" \
              limit $((bytes / 1500 + 1)) 2>&1)"; then
    link_exec tc qdisc replace dev "$LINK_IF_NS" root netem delay "$delay" rate "$rate" limit $((bytes / 1500 + 1))
    LINK_SHAPED="$rate, RTT $rtt ms (netem: $delay each way)"
    return 0
  fi
  case "$err" in
    *unknown*) ;;   # "Specified qdisc kind is unknown": no sch_netem in this kernel
    *) echo "[link] error: tc netem on $LINK_IF_HOST: $err" >&2; return 2 ;;
  esac
  local burst
  burst="$(awk -v b="$bits" 'BEGIN { x = b / 8 / 1000; printf "%.0f", x < 65536 ? 65536 : x }')"
  for dev in "$LINK_IF_HOST" "$LINK_IF_NS"; do
    local run=()
    [ "$dev" = "$LINK_IF_NS" ] && run=(link_exec)
    "${run[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" limit "$bytes"
  done
  LINK_SHAPED="$rate (tbf, rate only: this kernel has no sch_netem, so no delay is added; RTT $rtt ms asked)"
}

link_start_redis() {
  command -v redis-server >/dev/null || { echo "[link] error: redis-server is not installed" >&2; exit 2; }
  # Protected mode would refuse the host side (not loopback, no password); the address it listens
  # on is the namespace's end of the veth, which nothing but this host reaches.
  link_exec redis-server --port 6379 --bind "$LINK_NS_ADDR" --protected-mode no \
    --unixsocket "$LINK_DIR/redis.sock" --unixsocketperm 700 --save '' --appendonly no \
    --dir "$LINK_DIR" --logfile "$LINK_DIR/redis.log" &
  LINK_REDIS_PID=$!
  LINK_REDIS_UNIX="unix://$LINK_DIR/redis.sock"
  local _
  for _ in $(seq 1 100); do
    _link_py 5 'link_ping' >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "[link] redis did not start in the namespace" >&2
  cat "$LINK_DIR/redis.log" >&2 || true
  exit 1
}

# The RESP client of link_measure and of the start-up check; $1: seconds for the whole call.
_link_py() {
  local limit="$1"; shift
  timeout -k 5 "$limit" python3 - "$LINK_REDIS_TCP" "$@" <<'EOF'
import socket, statistics, sys, time
host, port = sys.argv[1][len("redis://"):].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=5)
s.settimeout(120)  # a 64 MiB value at 10 Mbit/s still fits
f = s.makefile("rb")

def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    s.sendall(b"".join(out))

def reply():
    line = f.readline()
    if line.startswith(b"-") or not line:
        sys.exit(f"redis: {line!r}")
    if line.startswith(b"$"):
        n = int(line[1:])
        buf = bytearray(n + 2)
        view, got = memoryview(buf), 0
        while got < n + 2:
            k = f.readinto(view[got:])
            if not k:
                sys.exit("redis: connection closed mid-value")
            got += k
        return n
    return line.strip()

if sys.argv[2] == "link_ping":
    command("PING"); sys.exit(0 if reply() == b"+PONG" else 1)

rtts = []
for _ in range(21):
    t = time.perf_counter(); command("PING"); reply(); rtts.append((time.perf_counter() - t) * 1000)
rtts = rtts[1:]  # the first one pays for the connection's warm-up
size = 64 << 20
value = bytes(range(256)) * (size // 256)
t = time.perf_counter(); command("SET", "e8kv:link-measure", value); reply(); set_s = time.perf_counter() - t
t = time.perf_counter(); command("GET", "e8kv:link-measure"); n = reply(); get_s = time.perf_counter() - t
command("DEL", "e8kv:link-measure"); reply()
assert n == size, n
gbit = lambda s: size * 8 / s / 1e9
print(f"[link] {sys.argv[3]}: PING median {statistics.median(rtts):.3f} ms (min {min(rtts):.3f}, max {max(rtts):.3f},"
      f" 20); SET 64 MiB {set_s * 1000:.0f} ms = {gbit(set_s):.3f} Gbit/s;"
      f" GET 64 MiB {get_s * 1000:.0f} ms = {gbit(get_s):.3f} Gbit/s", flush=True)
EOF
}

link_measure() {
  _link_py 300 measure "${1:-${LINK_SHAPED:-as set}}"
}

link_down() {
  ip link del "$LINK_IF_HOST" 2>/dev/null || true   # deletes both ends
  if ip netns list 2>/dev/null | grep -q "^$LINK_NS\( \|$\)"; then
    # The namespace outlives its deletion while a process runs in it: stop them first.
    local pids p _
    pids="$(ip netns pids "$LINK_NS" 2>/dev/null || true)"
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
      [ -z "$(ip netns pids "$LINK_NS" 2>/dev/null)" ] && break
      sleep 0.1
    done
    for p in $(ip netns pids "$LINK_NS" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$LINK_NS" 2>/dev/null || true
  fi
  [ -n "$LINK_REDIS_PID" ] && { wait "$LINK_REDIS_PID" 2>/dev/null || true; LINK_REDIS_PID=""; }
  [ -n "$LINK_DIR" ] && rm -rf "$LINK_DIR"
  LINK_DIR=""
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  if [ "${1:-}" != hook ] || [ $# != 4 ]; then echo "usage: $0 hook LINK_ID RTT_MS RATE|none" >&2; exit 2; fi
  LINK_ID="$2"; LINK_NS="e8kv-link-$2"; LINK_IF_HOST="e8kvh$2"; LINK_IF_NS="e8kvn$2"
  link_set "$4" "$3"
  link_measure "$LINK_SHAPED"
fi
