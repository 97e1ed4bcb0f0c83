#!/usr/bin/env bash
# The Python package's CI step (issue 37), called by .ci/run:
#  1. `pip install ./python` (the README's command) into a fresh numpy-only virtual environment
#     (build/python/core-venv): scikit-build-core builds libe8kv_c from this checkout (CUDA off);
#     then pytest runs the numpy tests there (the torch tests show as skipped);
#  2. the same build as a wheel, unpacked beside the shared torch + transformers + kvpress venv
#     (scripts/python-venv.sh, pinned by bench/peers/requirements.lock), runs every test: numpy,
#     e8kv.hf on a tiny random Llama, the SmolLM2 KL bound (E8KV_REQUIRE_DATA=1: the model must be
#     there), e8kv.kvpress.
# pytest exits 5 when it collects no test: with `set -e` that fails this script, as any failure does.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/build/python"
start=$(date +%s)
mkdir -p "$out"
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
rm -rf "$out/core-venv" "$out/wheel" "$out/site"
python3 -m venv "$out/core-venv"
"$out/core-venv/bin/pip" install --no-input -q "$root/python" "pytest>=8"
echo "[test-python] pip install ./python done after $(( $(date +%s) - start )) s"
(cd "$root/python" && "$out/core-venv/bin/python" -m pytest -q -p no:cacheprovider tests)
echo "[test-python] numpy-only tests done after $(( $(date +%s) - start )) s"

# The wheel of the same build (scikit-build-core reuses python/build/), unpacked for the torch venv.
"$out/core-venv/bin/pip" wheel --no-input -q --no-deps -w "$out/wheel" "$root/python"
"$out/core-venv/bin/python" -m zipfile -e "$out"/wheel/e8kv-*.whl "$out/site"
venv="$(bash "$root/scripts/python-venv.sh")"
echo "[test-python] torch venv ready after $(( $(date +%s) - start )) s"
(cd "$root/python" && E8KV_REQUIRE_DATA="${E8KV_REQUIRE_DATA:-0}" PYTHONPATH="$out/site" \
   "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
echo "[test-python] all Python tests done after $(( $(date +%s) - start )) s"
