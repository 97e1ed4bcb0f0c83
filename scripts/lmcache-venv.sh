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
venv="$(bash "$root/scripts/python-venv.sh" bench/lmcache/requirements.lock lmcache)"
# The imports the serde needs (a venv that installed but cannot import them is not usable).
"$venv/bin/python" -c "import lmcache.v1.distributed.serde, lmcache.lmcache_redis" >&2
echo "$venv"
