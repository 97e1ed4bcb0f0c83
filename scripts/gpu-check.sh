#!/usr/bin/env bash
# The prepared GPU check of the paged KV kernels (issue 5) for one H200 (sm_90), in under 8 minutes
# on 16 cores: build the GPU tests and e8kv-gpu-bench for sm_90, run the tests (compute-sanitizer
# memcheck and racecheck on parts of them when present), run the benches (ours, and PyTorch SDPA
# on the same shapes), print one short table. Logs and CSVs go to $OUT (set by the device tool;
# default build/gpu-check/out): summary.txt, build.log, tests.log, sanitizer.log, bench.log,
# bench.csv, sdpa.log, sdpa.csv.
#
# The device machine has nvcc, g++, python3 + torch, but no package registry and no GoogleTest,
# zstd or fmt packages, so the build does not go through the project's CMake: it compiles the
# sources the GPU binaries need (everything but the zstd container) directly with nvcc/g++.
#
#   scripts/gpu-check.sh --prepare    on the build host, once before the device call: copies the
#                                     GoogleTest sources to build/gpu-deps/googletest
#   scripts/gpu-check.sh [--quick]    on the device machine, e.g. device run with
#                                     command "bash scripts/gpu-check.sh", carry ["build/gpu-deps"],
#                                     timeout_s 540 (--quick: a small bench matrix)
# Environment: E8KV_GPU_ARCH (sm_90), E8KV_GPU_CHECK_JOBS (nproc), E8KV_GPU_CHECK_DIR (build
# folder, build/gpu-check), E8KV_GPU_DEPS (build/gpu-deps), E8KV_GPU_CHECK_BUILD_ONLY=1 (stop
# after the build: checks the script on a machine without a GPU).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEPS="${E8KV_GPU_DEPS:-$ROOT/build/gpu-deps}"

if [ "${1:-}" = "--prepare" ]; then
  src=""
  for cand in /usr/src/googletest/googletest /usr/src/gtest; do
    if [ -f "$cand/src/gtest-all.cc" ]; then src="$cand"; break; fi
  done
  if [ -z "$src" ]; then echo "gpu-check --prepare: GoogleTest sources not found (apt-get install libgtest-dev)" >&2; exit 1; fi
  rm -rf "$DEPS/googletest" && mkdir -p "$DEPS" && cp -r "$src" "$DEPS/googletest"
  echo "gpu-check --prepare: copied $src to $DEPS/googletest ($(du -sh "$DEPS" | cut -f1)); carry build/gpu-deps"
  exit 0
fi

QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
OUT="${OUT:-$ROOT/build/gpu-check/out}"
mkdir -p "$OUT"
B="${E8KV_GPU_CHECK_DIR:-$ROOT/build/gpu-check}"
mkdir -p "$B/obj"
JOBS="${E8KV_GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 8)}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo "$(( $(date +%s) - START ))s"; }

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
say "== e8kv gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
say "$(nvcc --version | tail -1)"

# ---- build --------------------------------------------------------------------------------------
ARCH="${E8KV_GPU_ARCH:-sm_90}"
CXXFLAGS=(-std=c++17 -O2 -ffp-contract=off -Iinclude -Itests -DE8KV_HAS_CUDA=1)
NVFLAGS=(-std=c++17 -O3 "-arch=$ARCH" --expt-relaxed-constexpr -lineinfo -Iinclude -Itests -DE8KV_HAS_CUDA=1
         -Xcompiler=-ffp-contract=off)
GTEST_INC=()
if [ -f "$DEPS/googletest/src/gtest-all.cc" ]; then
  GTEST_INC=(-isystem "$DEPS/googletest/include" -I"$DEPS/googletest")
elif [ ! -f /usr/include/gtest/gtest.h ]; then
  say "GoogleTest not found: run 'scripts/gpu-check.sh --prepare' on the build host and carry build/gpu-deps"
fi
: > "$OUT/build.log"
compile() {  # compile <object> <compiler> <args...>: in the background (at most $JOBS at once), logged
  local obj="$1"; shift
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  ( "$@" -c -o "$obj" >> "$OUT/build.log" 2>&1 || echo "FAILED: $obj" >> "$OUT/build.log" ) &
}
objs_lib=()
for s in src/*.cpp; do
  case "$s" in src/container.cpp) continue ;; esac  # zstd + fmt: not needed by the GPU binaries
  o="$B/obj/$(basename "$s" .cpp).o"; objs_lib+=("$o"); compile "$o" g++ "${CXXFLAGS[@]}" "$s"
done
for s in kernels/*.cu; do
  o="$B/obj/k_$(basename "$s" .cu).o"; objs_lib+=("$o"); compile "$o" nvcc "${NVFLAGS[@]}" "$s"
done
gtest_obj=()
if [ ${#GTEST_INC[@]} -gt 0 ]; then
  gtest_obj=("$B/obj/gtest-all.o"); compile "$B/obj/gtest-all.o" g++ -std=c++17 -O2 "${GTEST_INC[@]}" "$DEPS/googletest/src/gtest-all.cc"
fi
tests=()
for s in tests/cuda/*_test.cu; do
  n="gpu_$(basename "$s" .cu)"; tests+=("$n"); compile "$B/obj/$n.o" nvcc "${NVFLAGS[@]}" "${GTEST_INC[@]}" "$s"
done
compile "$B/obj/gpu_bench.o" nvcc "${NVFLAGS[@]}" bench/gpu/gpu_bench.cu
wait
build_ok=1
grep -q "^FAILED" "$OUT/build.log" && build_ok=0
link() {  # link <binary> <objects...>
  local bin="$1"; shift
  nvcc "-arch=$ARCH" -o "$B/$bin" "$@" -lpthread >> "$OUT/build.log" 2>&1 || { echo "FAILED: link $bin" >> "$OUT/build.log"; build_ok=0; }
}
if [ $build_ok = 1 ]; then
  for n in "${tests[@]}"; do
    if [ ${#gtest_obj[@]} -gt 0 ]; then link "$n" "$B/obj/$n.o" "${objs_lib[@]}" "${gtest_obj[@]}"
    else link "$n" "$B/obj/$n.o" "${objs_lib[@]}" -lgtest; fi
  done
  link e8kv-gpu-bench "$B/obj/gpu_bench.o" "${objs_lib[@]}"
fi
if [ $build_ok = 1 ]; then say "build ($ARCH): ok ($(elapsed))"; else
  say "build ($ARCH): FAILED ($(elapsed)); see build.log"; grep -E "error|FAILED" "$OUT/build.log" | head -20 | tee -a "$SUMMARY"; exit 1
fi
[ -n "${E8KV_GPU_CHECK_BUILD_ONLY:-}" ] && exit 0

# ---- tests --------------------------------------------------------------------------------------
: > "$OUT/tests.log"
fails=0
for n in "${tests[@]}"; do
  timeout 300 "$B/$n" >> "$OUT/tests.log" 2>&1
  rc=$?
  case $rc in
    0) say "test $n: PASS" ;;
    77) say "test $n: SKIPPED (no device)" ;;
    *) say "test $n: FAIL (rc $rc)"; fails=$((fails + 1)); grep -E "^\[  FAILED  \]|Failure|error" "$OUT/tests.log" | head -8 | tee -a "$SUMMARY" ;;
  esac
done
say "tests: $fails failing binaries ($(elapsed))"

# ---- compute-sanitizer ----------------------------------------------------------------------------
: > "$OUT/sanitizer.log"
if command -v compute-sanitizer >/dev/null 2>&1; then
  sanitize() {  # sanitize <tool> <binary> <gtest filter>
    timeout 150 compute-sanitizer --tool "$1" --error-exitcode 3 "$B/$2" --gtest_filter="$3" >> "$OUT/sanitizer.log" 2>&1
    local rc=$?
    case $rc in 0) say "sanitizer $1 $2 [$3]: clean" ;; 124) say "sanitizer $1 $2: timed out" ;;
      *) say "sanitizer $1 $2 [$3]: rc $rc (see sanitizer.log)" ;; esac
  }
  sanitize memcheck gpu_paged_encode_test "*ByteIdentical*:*Unsupported*"
  sanitize memcheck gpu_decode_attention_test "*QueryAndOutputDtypes*:*Dequantize*:*BadArguments*"
  sanitize racecheck gpu_decode_attention_test "*QueryAndOutputDtypes*"
else
  say "compute-sanitizer: not installed"
fi
say "sanitizer done ($(elapsed))"

# ---- benches ------------------------------------------------------------------------------------
timeout 200 "$B/e8kv-gpu-bench" $QUICK --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
say "e8kv-gpu-bench: rc $? ($(elapsed))"
sed -n '/^encode:/,/^$/p' "$OUT/bench.log" | tee -a "$SUMMARY"
sed -n '/^memory:/,$p' "$OUT/bench.log" | tee -a "$SUMMARY"
PYTHONUNBUFFERED=1 timeout 150 python3 bench/gpu/sdpa_bench.py $QUICK --csv "$OUT/sdpa.csv" --ours "$OUT/bench.csv" \
  > "$OUT/sdpa.log" 2>&1
say "sdpa_bench: rc $? ($(elapsed))"
if grep -q "^decode attention latency" "$OUT/sdpa.log"; then
  sed -n '/^decode attention latency/,$p' "$OUT/sdpa.log" | tee -a "$SUMMARY"
else
  sed -n '/^decode attention:/,/^$/p' "$OUT/bench.log" | tee -a "$SUMMARY"
fi
say "== done in $(elapsed)"
[ $fails = 0 ]
