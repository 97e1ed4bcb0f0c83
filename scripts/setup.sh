#!/usr/bin/env bash
# Installs what e8kv needs from Debian packages, only when something is missing (idempotent).
# Called by scripts/test.sh and scripts/run.sh; never needs to be run by hand.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in cmake g++ make pkg-config libzstd-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev \
         clang libclang-rt-dev python3 unzip curl patch redis-server libhiredis-dev; do
  have_pkg "$p" || need+=("$p")
done

if [ ${#need[@]} -gt 0 ]; then
  echo "[setup] installing: ${need[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# nvcc is optional: the CUDA kernels are compiled when it exists (it ships with the CUDA toolkit).
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "[setup] note: nvcc is at /usr/local/cuda/bin; add it to PATH to build the CUDA kernels" >&2
fi
exit 0
