#!/usr/bin/env bash
# The LMCache serde's tests (python/tests/test_lmcache.py) in LMCache's own venv (scripts/lmcache-venv.sh,
# pinned by bench/lmcache/requirements.lock; ~2.5 min to create the first time, reused after), with the
# e8kv wheel that scripts/test-python.sh unpacked in build/python/site (built here when it is missing),
# or python/src with E8KV_LIBRARY=path/to/libe8kv_c.so (a development build).
# The test starts its own redis-server on 127.0.0.1 (no persistence) and stops it; pytest's summary
# (-rs) names every skipped test and why, so a run without LMCache or redis-server is visibly skipped.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/build/python"
start=$(date +%s)
site="$out/site"
if [ -n "${E8KV_LIBRARY:-}" ]; then  # a development build's libe8kv_c.so: the package from the checkout
  site="$root/python/src"
elif [ ! -d "$out/site/e8kv" ]; then
  rm -rf "$out/lmcache-wheel" "$out/site"
  python3 -m pip wheel --no-input -q --no-deps -w "$out/lmcache-wheel" "$root/python"
  python3 -m zipfile -e "$out"/lmcache-wheel/e8kv-*.whl "$out/site"
fi
venv="$(bash "$root/scripts/lmcache-venv.sh")"
echo "[test-lmcache] LMCache venv ready after $(( $(date +%s) - start )) s"
(cd "$root/python" && PYTHONPATH="$site" "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider \
   -W ignore::FutureWarning tests/test_lmcache.py)
echo "[test-lmcache] done after $(( $(date +%s) - start )) s"
