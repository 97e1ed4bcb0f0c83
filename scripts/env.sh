# Sourced by the scripts: common paths and the build directory.
E8KV_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
E8KV_JOBS="${E8KV_JOBS:-$(nproc 2>/dev/null || echo 2)}"
# CUDA on when nvcc exists (kernels must compile everywhere CI runs); E8KV_CUDA=OFF to skip.
if [ -z "${E8KV_CUDA:-}" ]; then
  if command -v nvcc >/dev/null 2>&1; then E8KV_CUDA=ON; else E8KV_CUDA=OFF; fi
fi
E8KV_BUILD="${E8KV_BUILD:-$E8KV_ROOT/build/main}"
# E8KV_CMAKE_ARGS: extra configure arguments, word-split (CI: -DE8KV_KERNEL_COST=ON).
# llama.cpp's source tree when fetched (scripts/fetch-llama-cpp.sh): the llama.cpp adapter's engine
# tests build libllama from it; empty: they are not built.
E8KV_LLAMA_CPP_SOURCE="${E8KV_LLAMA_CPP_SOURCE-$(bash "$E8KV_ROOT/scripts/fetch-llama-cpp.sh" --print-path)}"
configure_and_build() {
  # shellcheck disable=SC2086
  cmake -S "$E8KV_ROOT" -B "$E8KV_BUILD" -DCMAKE_BUILD_TYPE=Release -DE8KV_CUDA="$E8KV_CUDA" \
        -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-80;90}" \
        -DE8KV_LLAMA_CPP_SOURCE="$E8KV_LLAMA_CPP_SOURCE" ${E8KV_CMAKE_ARGS:-} "$@" >/dev/null
  cmake --build "$E8KV_BUILD" -j "$E8KV_JOBS" "${E8KV_TARGETS[@]/#/--target=}"
}
