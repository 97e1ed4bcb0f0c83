#!/usr/bin/env bash
# Prints the path of the torch + transformers + kvpress virtual environment that the peer harness
# (scripts/peers.sh) and the Python package's transformers tests (scripts/test-python.sh) share,
# creating it first from bench/peers/requirements.lock when it is missing or was made from another
# lock (~6 GB: torch pulls CUDA wheels, PyPI has no CPU-only torch; ~4.5 min to install here).
# Location: ${E8KV_CACHE:-~/.cache/e8kv}/peers/venv. Progress goes to stderr.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${E8KV_CACHE:-$HOME/.cache/e8kv}"
# Arguments (scripts/lmcache-venv.sh passes them): another lock file, relative to the repository,
# and the cache folder's name for its venv; with none, the peers' venv above.
lock_rel="${1:-bench/peers/requirements.lock}"
venv="$cache/${2:-peers}/venv"
lock="$root/$lock_rel"
if [ ! -x "$venv/bin/python" ] || ! cmp -s "$lock" "$venv/.e8kv-lock"; then
  echo "[python-venv] creating $venv from $lock_rel (~6 GB)" >&2
  rm -rf "$venv"
  if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then  # Debian's python3 ships venv apart
    SUDO=""; [ "$(id -u)" != 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --no-input -q -r "$lock" >&2
  cp "$lock" "$venv/.e8kv-lock"
fi
echo "$venv"
