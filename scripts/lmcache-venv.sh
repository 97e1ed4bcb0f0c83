#!/usr/bin/env bash
# Prints the path of the LMCache virtual environment that the e8kv LMCache serde's tests and benchmark
# use (python/tests/test_lmcache.py, python/bench/lmcache_bytes.py), creating it first from
# bench/lmcache/requirements.lock when it is missing or was made from another lock (~6 GB: torch and
# LMCache pull CUDA wheels, PyPI has no CPU-only build; ~2.5 min to install here; everything runs on
# the CPU). Kept apart from the peers' venv (scripts/python-venv.sh): lmcache 0.5.6 needs numpy <= 2.2.6
# and transformers >= 5.4, which the peers' pins exclude.
# Location: ${E8KV_CACHE:-~/.cache/e8kv}/lmcache/venv. Progress goes to stderr.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${E8KV_CACHE:-$HOME/.cache/e8kv}"
venv="$cache/lmcache/venv"
lock="$root/bench/lmcache/requirements.lock"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$lock" "$venv/.e8kv-lock"; then
  echo "[lmcache-venv] creating $venv from bench/lmcache/requirements.lock (~6 GB)" >&2
  rm -rf "$venv"
  if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then  # Debian's python3 ships venv apart
    SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --no-input -q -r "$lock" >&2
  "$venv/bin/python" -c "import lmcache.v1.distributed.serde, lmcache.lmcache_redis" >&2
  cp "$lock" "$venv/.e8kv-lock"
fi
echo "$venv"
