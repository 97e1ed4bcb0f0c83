#!/usr/bin/env bash
# The prepared GPU check of the paged KV kernels for one H200 (sm_90), time-boxed: the whole run,
# build included, ends within E8KV_GPU_CHECK_BUDGET seconds (default 290 s, under 5 minutes on a
# bare 16-core device machine), so a rerun fits in 15 minutes of device time.
#
# Steps, each under its own timeout (its cap below, cut to what the global budget has left):
#   build      <= 130 s  the GPU tests and e8kv-gpu-bench for sm_90 (all objects in parallel)
#   tests      <=  70 s  the GPU test binaries, shortest first (codes byte-identical, attention
#                        within tolerance)
#   bench      <=  40 s  e8kv-gpu-bench: encode, decode (k2v2 / k3v2 default storage, k2v2-post,
#                        k2v2-pre / k3v2-pre, fp16; medians, rotated buffers, % of 4.3 TB/s,
#                        split plans), memory
#   sdpa       <=  30 s  PyTorch SDPA on the same shapes (flash pinned, per-shape fallback)
#   sanitizer  what is left (<= 30 s a tool): compute-sanitizer memcheck / racecheck, small filters
# Optional pieces never stop the run before the benches: without GoogleTest the tests are
# skipped (said in the summary), without compute-sanitizer or torch those steps are skipped.
# Output: at most 8 files in $OUT (set by the device tool; default build/gpu-check/out):
# summary.txt, build.log, tests.log, sanitizer.log, bench.log, bench.csv, sdpa.log, sdpa.csv.
#
# Build path (the only one): direct nvcc/g++ compile lines below, not CMake. The device machine
# has nvcc, g++, python3 and torch, but no package registry and no zstd, fmt or GoogleTest
# development packages, which the project's CMake requires (e8kvDependencies, tests/). So this
# script compiles every library source (src/**/*.cpp, fmt header-only), kernels/*.cu, the test
# and bench sources into one archive and its binaries, with what --prepare carries along:
#
#   scripts/gpu-check.sh --prepare    on the build host, once before the device call: copies the
#                                     GoogleTest sources, fmt's headers and zstd's headers and
#                                     static library to build/gpu-deps (~4 MB)
#   scripts/gpu-check.sh [--quick]    on the device machine: device run with command
#                                     "bash scripts/gpu-check.sh", carry ["build/gpu-deps"],
#                                     timeout_s 330 (--quick: a small bench matrix)
# Environment: E8KV_GPU_ARCH (sm_90), E8KV_GPU_CHECK_JOBS (nproc), E8KV_GPU_CHECK_DIR (build
# folder, build/gpu-check), E8KV_GPU_DEPS (build/gpu-deps), E8KV_GPU_CHECK_BUDGET (290),
# E8KV_GPU_CHECK_BUILD_CAP (130 s; the whole budget with BUILD_ONLY), E8KV_GPU_CHECK_BUILD_ONLY=1
# (stop after the build: checks the script on a build host without a GPU, slower than the device),
# E8KV_GPU_CHECK_REUSE=1 (a rerun on the same, still warm machine: keep the binaries of the last
# build when they all exist, and spend the build's time on the other steps).
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
  # The library's own dependencies: fmt's headers (used header-only there) and zstd's headers and
  # static library (x86-64, as the device machine's host).
  fmt_dir=$(dirname "$(ls /usr/include/fmt/format.h 2>/dev/null)")
  zstd_lib=$(ls /usr/lib/x86_64-linux-gnu/libzstd.a /usr/lib64/libzstd.a /usr/lib/libzstd.a 2>/dev/null | head -1)
  if [ -z "$fmt_dir" ] || [ -z "$zstd_lib" ] || [ ! -f /usr/include/zstd.h ]; then
    echo "gpu-check --prepare: fmt headers or zstd's headers/static library not found (bash scripts/setup.sh)" >&2; exit 1
  fi
  rm -rf "$DEPS/fmt" "$DEPS/zstd" && mkdir -p "$DEPS/fmt/include" "$DEPS/zstd/include" "$DEPS/zstd/lib"
  cp -r "$fmt_dir" "$DEPS/fmt/include/fmt"
  cp /usr/include/zstd.h /usr/include/zstd_errors.h "$DEPS/zstd/include/" && cp "$zstd_lib" "$DEPS/zstd/lib/libzstd.a"
  echo "gpu-check --prepare: GoogleTest ($src), fmt headers, zstd headers + libzstd.a copied to $DEPS ($(du -sh "$DEPS" | cut -f1)); carry build/gpu-deps"
  exit 0
fi

QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
OUT="${OUT:-$ROOT/build/gpu-check/out}"
mkdir -p "$OUT"
B="${E8KV_GPU_CHECK_DIR:-$ROOT/build/gpu-check}"
mkdir -p "$B/obj"
JOBS="${E8KV_GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 8)}"
BUDGET="${E8KV_GPU_CHECK_BUDGET:-290}"
START=$(date +%s)
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
elapsed() { echo "$(( $(date +%s) - START ))s"; }
# Seconds a step may take: its cap, cut to what the global budget has left (0: no time left).
allot() {
  local cap="$1" left=$(( BUDGET - ($(date +%s) - START) ))
  [ "$left" -lt "$cap" ] && cap="$left"
  [ "$cap" -lt 0 ] && cap=0
  echo "$cap"
}

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
say "== e8kv gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), budget ${BUDGET}s"
if command -v nvidia-smi >/dev/null 2>&1; then
  say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
else
  say "nvidia-smi: not found"
fi
say "$(nvcc --version 2>&1 | tail -1)"

# ---- build (<= 130 s) -----------------------------------------------------------------------------
ARCH="${E8KV_GPU_ARCH:-sm_90}"
CXXFLAGS=(-std=c++17 -O2 -ffp-contract=off -Iinclude -Itests -DE8KV_HAS_CUDA=1)
NVFLAGS=(-std=c++17 -O3 "-arch=$ARCH" --expt-relaxed-constexpr -lineinfo -Iinclude -Itests -DE8KV_HAS_CUDA=1
         -Xcompiler=-ffp-contract=off)
# The library's dependencies: carried by --prepare, else the system's.
LIB_DEPS=()
if [ -f "$DEPS/fmt/include/fmt/format.h" ]; then
  CXXFLAGS+=(-I"$DEPS/fmt/include" -DFMT_HEADER_ONLY)
else
  CXXFLAGS+=(-DFMT_HEADER_ONLY)
fi
if [ -f "$DEPS/zstd/lib/libzstd.a" ]; then
  CXXFLAGS+=(-I"$DEPS/zstd/include"); LIB_DEPS=("$DEPS/zstd/lib/libzstd.a")
else
  LIB_DEPS=(-lzstd)
fi
GTEST_INC=()
gtest_obj=()
tests=()
built_tests=()
have_gtest=1
if [ -f "$DEPS/googletest/src/gtest-all.cc" ]; then
  GTEST_INC=(-isystem "$DEPS/googletest/include" -I"$DEPS/googletest")
elif [ ! -f /usr/include/gtest/gtest.h ]; then
  have_gtest=0
  say "GoogleTest not found: tests skipped (run 'scripts/gpu-check.sh --prepare' on the build host, carry build/gpu-deps)"
fi
BUILD_LOG="$B/build-full.log"
reuse=0
if [ -n "${E8KV_GPU_CHECK_REUSE:-}" ] && [ -x "$B/e8kv-gpu-bench" ]; then
  reuse=1
  for s in tests/cuda/*_test.cu tests/cuda/*_test.cpp; do [ -x "$B/gpu_$(basename "${s%.*}")" ] || reuse=0; done
fi
[ $reuse = 0 ] && : > "$BUILD_LOG"
if [ $reuse = 1 ]; then
  lib_ok=1; bench_ok=1
  for s in tests/cuda/device_probe_test.cu tests/cuda/paged_encode_test.cpp tests/cuda/decode_attention_test.cpp \
           $(ls tests/cuda/*_test.cu tests/cuda/*_test.cpp | grep -v -e device_probe_test -e paged_encode_test -e decode_attention_test); do
    n="gpu_$(basename "${s%.*}")"; tests+=("$n"); built_tests+=("$n")
  done
  echo "reused the binaries of the last build (E8KV_GPU_CHECK_REUSE)" >> "$BUILD_LOG"
else
  BUILD_CAP="${E8KV_GPU_CHECK_BUILD_CAP:-$([ -n "${E8KV_GPU_CHECK_BUILD_ONLY:-}" ] && echo "$BUDGET" || echo 130)}"
  BUILD_DEADLINE=$(( $(date +%s) + $(allot "$BUILD_CAP") ))
  compile() {  # compile <object> <compiler> <args...>: in the background (at most $JOBS at once), logged
    local obj="$1"; shift
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    local t=$(( BUILD_DEADLINE - $(date +%s) )); [ "$t" -lt 1 ] && t=1
    ( timeout "$t" "$@" -c -o "$obj" >> "$BUILD_LOG" 2>&1 || echo "FAILED: $obj" >> "$BUILD_LOG" ) &
  }
  objs_lib=()
  for s in $(find src -name '*.cpp' | sort); do  # every library source (CMake's E8KV_SOURCES)
    o="$B/obj/lib_$(echo "${s#src/}" | tr / _ | sed 's/\.cpp$//').o"; objs_lib+=("$o")
    compile "$o" g++ "${CXXFLAGS[@]}" -Isrc "$s"  # src/: the library's private headers
  done
  for s in kernels/*.cu; do
    o="$B/obj/k_$(basename "$s" .cu).o"; objs_lib+=("$o"); compile "$o" nvcc "${NVFLAGS[@]}" "$s"
  done
  compile "$B/obj/gpu_bench.o" nvcc "${NVFLAGS[@]}" bench/gpu/gpu_bench.cu
  if [ $have_gtest = 1 ]; then
    if [ ${#GTEST_INC[@]} -gt 0 ]; then
      gtest_obj=("$B/obj/gtest-all.o"); compile "$B/obj/gtest-all.o" g++ -std=c++17 -O2 "${GTEST_INC[@]}" "$DEPS/googletest/src/gtest-all.cc"
    fi
    # Shortest first, so a cut at the tests' deadline loses the least.
    for s in tests/cuda/device_probe_test.cu tests/cuda/paged_encode_test.cpp tests/cuda/decode_attention_test.cpp \
             $(ls tests/cuda/*_test.cu tests/cuda/*_test.cpp | grep -v -e device_probe_test -e paged_encode_test -e decode_attention_test); do
      n="gpu_$(basename "${s%.*}")"; tests+=("$n"); compile "$B/obj/$n.o" nvcc "${NVFLAGS[@]}" "${GTEST_INC[@]}" "$s"
    done
  fi
  wait
  link() {  # link <binary> <objects...>: 0 when it linked
    local bin="$1"; shift
    nvcc "-arch=$ARCH" -o "$B/$bin" "$@" "$B/libe8kv-gpu-check.a" "${LIB_DEPS[@]}" -lpthread >> "$BUILD_LOG" 2>&1 ||
      { echo "FAILED: link $bin" >> "$BUILD_LOG"; return 1; }
  }
  lib_ok=1
  for o in "${objs_lib[@]}"; do grep -q "^FAILED: $o\$" "$BUILD_LOG" && lib_ok=0; done
  # One archive: a binary takes only the objects it needs.
  if [ $lib_ok = 1 ]; then
    rm -f "$B/libe8kv-gpu-check.a"
    ar rcs "$B/libe8kv-gpu-check.a" "${objs_lib[@]}" >> "$BUILD_LOG" 2>&1 || { echo "FAILED: archive" >> "$BUILD_LOG"; lib_ok=0; }
  fi
  bench_ok=0
  if [ $lib_ok = 1 ] && ! grep -q "^FAILED: $B/obj/gpu_bench.o\$" "$BUILD_LOG"; then
    link e8kv-gpu-bench "$B/obj/gpu_bench.o" && bench_ok=1
  fi
  if [ $lib_ok = 1 ]; then
    for n in "${tests[@]}"; do
      grep -q "^FAILED: $B/obj/$n.o\$" "$BUILD_LOG" && continue
      if [ ${#gtest_obj[@]} -gt 0 ]; then link "$n" "$B/obj/$n.o" "${gtest_obj[@]}" && built_tests+=("$n")
      else link "$n" "$B/obj/$n.o" -lgtest && built_tests+=("$n"); fi
    done
  fi
fi
# build.log: the failures and the last lines (the full log can be long).
{ grep -E "error|FAILED" "$BUILD_LOG" | head -60; echo "-- last lines --"; tail -40 "$BUILD_LOG"; } > "$OUT/build.log"
say "build ($ARCH, $JOBS jobs): library $([ $lib_ok = 1 ] && echo ok || echo FAILED), bench $([ $bench_ok = 1 ] && echo ok || echo FAILED), tests ${#built_tests[@]}/${#tests[@]} ($(elapsed))"
if [ $lib_ok = 0 ]; then grep -E "error|FAILED" "$BUILD_LOG" | head -12 | tee -a "$SUMMARY"; fi
[ -n "${E8KV_GPU_CHECK_BUILD_ONLY:-}" ] && { [ $lib_ok = 1 ] && [ $bench_ok = 1 ]; exit $?; }

# ---- tests (<= 70 s) ------------------------------------------------------------------------------
: > "$OUT/tests.log"
fails=0
TESTS_DEADLINE=$(( $(date +%s) + $(allot 70) ))
for n in "${built_tests[@]}"; do
  t=$(( TESTS_DEADLINE - $(date +%s) ))
  if [ "$t" -lt 2 ]; then say "test $n: not run (tests' time used up)"; continue; fi
  timeout "$t" "$B/$n" --gtest_brief=1 >> "$OUT/tests.log" 2>&1
  rc=$?
  case $rc in
    0) say "test $n: PASS" ;;
    77) say "test $n: SKIPPED (no device)" ;;
    124) say "test $n: TIMED OUT after ${t}s"; fails=$((fails + 1)) ;;
    *) say "test $n: FAIL (rc $rc)"; fails=$((fails + 1)); grep -E "^\[  FAILED  \]|Failure" "$OUT/tests.log" | head -8 | tee -a "$SUMMARY" ;;
  esac
done
say "tests: ${#built_tests[@]} binaries, $fails failing ($(elapsed))"

# ---- benches (<= 40 s + <= 30 s) ------------------------------------------------------------------
t=$(allot 40)
if [ $bench_ok = 1 ] && [ "$t" -lt 5 ]; then
  say "e8kv-gpu-bench: no time left"
  : > "$OUT/bench.csv"
elif [ $bench_ok = 1 ]; then
  timeout "$t" "$B/e8kv-gpu-bench" $QUICK --csv "$OUT/bench.csv" > "$OUT/bench.log" 2>&1
  rc=$?
  say "e8kv-gpu-bench: rc $rc$([ $rc = 124 ] && echo " (cut at ${t}s: partial)") ($(elapsed))"
  sed -n '/^encode:/,/^$/p' "$OUT/bench.log" | tee -a "$SUMMARY"
  sed -n '/^memory:/,$p' "$OUT/bench.log" | tee -a "$SUMMARY"
else
  say "e8kv-gpu-bench: not built"
  : > "$OUT/bench.csv"
fi
t=$(allot 30)
if [ "$t" -ge 5 ]; then
  PYTHONUNBUFFERED=1 timeout "$t" python3 bench/gpu/sdpa_bench.py $QUICK --csv "$OUT/sdpa.csv" --ours "$OUT/bench.csv" \
    > "$OUT/sdpa.log" 2>&1
  rc=$?
  say "sdpa_bench: rc $rc$([ $rc = 124 ] && echo " (cut at ${t}s: partial)") ($(elapsed))"
else
  say "sdpa_bench: no time left"
fi
if grep -q "^decode attention latency" "$OUT/sdpa.log" 2>/dev/null; then
  sed -n '/^decode attention latency/,$p' "$OUT/sdpa.log" | tee -a "$SUMMARY"
else
  sed -n '/^decode attention:/,/^$/p' "$OUT/bench.log" 2>/dev/null | tee -a "$SUMMARY"
fi

# ---- compute-sanitizer (what is left) ----------------------------------------------------
: > "$OUT/sanitizer.log"
SAN=""
for cand in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  if [ -n "$cand" ] && [ -x "$cand" ]; then SAN="$cand"; break; fi
done
if [ -z "$SAN" ]; then
  say "compute-sanitizer: not installed"
else
  sanitize() {  # sanitize <tool> <binary> <gtest filter>
    local t; t=$(allot 30)
    if [ "$t" -lt 5 ]; then say "sanitizer $1 $2: no time left"; return; fi
    [ -x "$B/$2" ] || { say "sanitizer $1 $2: not built"; return; }
    timeout "$t" "$SAN" --tool "$1" --error-exitcode 3 "$B/$2" --gtest_brief=1 --gtest_filter="$3" >> "$OUT/sanitizer.log" 2>&1
    local rc=$?
    case $rc in 0) say "sanitizer $1 $2 [$3]: clean" ;; 124) say "sanitizer $1 $2: timed out after ${t}s" ;;
      *) say "sanitizer $1 $2 [$3]: rc $rc (see sanitizer.log)" ;; esac
  }
  sanitize memcheck gpu_decode_attention_test "*QueryAndOutputDtypes*:*BeyondThePlan*:*Unaligned*"
  sanitize memcheck gpu_paged_encode_test "*SlotsOutsideThePool*:*Unsupported*"
  sanitize racecheck gpu_decode_attention_test "*QueryAndOutputDtypes*"
fi
say "== done in $(elapsed) (budget ${BUDGET}s)"
[ $fails = 0 ] && [ $bench_ok = 1 ]
