#!/usr/bin/env bash
# Builds the container deserialization fuzzer (fuzz/container_fuzz.cpp) with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer against the library sources, seeds it with
# the golden files of tests/data, and runs it for a bounded time. A crash, a sanitizer report
# or a leak fails the script (exit status != 0); the input that did it is left in
# $E8KV_FUZZ_BUILD/artifacts/.
#
#   scripts/fuzz.sh [SECONDS]      default 60
#   E8KV_FUZZ_BUILD=dir            build + corpus directory (default build/fuzz)
#   E8KV_FUZZ_CXX=clang++-NN       compiler (default clang++)
#   E8KV_JOBS=N                    parallel compiles (default nproc)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_TO_RUN="${1:-60}"
BUILD="${E8KV_FUZZ_BUILD:-$ROOT/build/fuzz}"
CXX="${E8KV_FUZZ_CXX:-clang++}"
JOBS="${E8KV_JOBS:-$(nproc 2>/dev/null || echo 2)}"
command -v "$CXX" >/dev/null || { echo "fuzz.sh: $CXX not found (scripts/setup.sh installs clang)" >&2; exit 2; }

COMMON=(-std=c++17 -g -fno-omit-frame-pointer -ffp-contract=off -fno-sanitize-recover=all -I"$ROOT/include")
# The code under test gets coverage instrumentation and -O1. The sources it only calls into
# (codecs, cache) get the sanitizers at -O0: with coverage at -O1, compressed_kv.cpp alone takes
# minutes to compile.
FUZZED=("$ROOT/src/container.cpp" "$ROOT/fuzz/container_fuzz.cpp")
SUPPORT=("$ROOT/src/compressed_kv.cpp" "$ROOT/src/version.cpp")
mkdir -p "$BUILD/obj" "$BUILD/corpus" "$BUILD/artifacts"

stamp="$BUILD/obj/.stamp"
newest_header="$(find "$ROOT/include" -name '*.hpp' -newer "$stamp" 2>/dev/null | head -n1 || true)"
[ -f "$stamp" ] || newest_header=all
objects=()
pids=()
compile() {  # src, flags...
  local src="$1"; shift
  local obj="$BUILD/obj/$(basename "${src%.cpp}").o"
  objects+=("$obj")
  if [ ! -f "$obj" ] || [ "$src" -nt "$obj" ] || [ -n "$newest_header" ]; then
    "$CXX" "${COMMON[@]}" "$@" -c "$src" -o "$obj" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$JOBS" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  fi
}
for src in "${SUPPORT[@]}"; do compile "$src" -O0 -fsanitize=address,undefined; done
for src in "${FUZZED[@]}"; do compile "$src" -O1 -fsanitize=fuzzer-no-link,address,undefined; done
for p in "${pids[@]}"; do wait "$p"; done
touch "$stamp"
"$CXX" -fsanitize=fuzzer,address,undefined "${objects[@]}" -lzstd -lpthread -o "$BUILD/container_fuzz"

# Seeds: every golden file, once with checksums verified (first byte 1) and once without (0).
for f in "$ROOT"/tests/data/*.e8kv; do
  name="$(basename "$f" .e8kv)"
  { printf '\001'; cat "$f"; } > "$BUILD/corpus/seed-crc-$name"
  { printf '\000'; cat "$f"; } > "$BUILD/corpus/seed-nocrc-$name"
done

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "[fuzz] running container_fuzz for ${SECONDS_TO_RUN}s (corpus $BUILD/corpus)"
"$BUILD/container_fuzz" -max_total_time="$SECONDS_TO_RUN" -timeout=20 -rss_limit_mb=2560 -max_len=65536 \
  -artifact_prefix="$BUILD/artifacts/" -print_final_stats=1 "$BUILD/corpus"
