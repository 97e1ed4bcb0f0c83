"""Shared fixtures: a small model shape and seeded random K/V/queries (seeds printed on failure)."""
import numpy as np
import pytest

SHAPE = (2, 2, 4, 64)  # layers, kv heads, q heads (GQA 2), head_dim
SEED = 1234


def make_kv(tokens: int, seed: int = SEED, shape=SHAPE, window: int = 32):
    """keys, values [layers, tokens, kv_heads, d] and queries [layers, window, q_heads, d], float32,
    keys with a per-channel offset as post-RoPE keys have."""
    rng = np.random.default_rng(seed)
    layers, hkv, hq, d = shape
    k = rng.standard_normal((layers, tokens, hkv, d), dtype=np.float32) + rng.standard_normal(d).astype(np.float32)
    v = rng.standard_normal((layers, tokens, hkv, d), dtype=np.float32)
    q = rng.standard_normal((layers, window, hq, d), dtype=np.float32)
    return k, v, q


def reference_attention(q, keys, values, mask=None, scale=None):
    """Brute-force attention of one query token q [hq, d] over keys/values [n, hkv, d] (float64),
    mask [hkv, n] additive (0 / -inf). Returns out [hq, d], lse [hq]."""
    hq, d = q.shape
    n, hkv, _ = keys.shape
    g = hq // hkv
    scale = d ** -0.5 if scale is None else scale
    out, lse = np.zeros((hq, d)), np.zeros(hq)
    for h in range(hq):
        s = scale * keys[:, h // g, :].astype(np.float64) @ q[h].astype(np.float64)
        if mask is not None:
            s = s + mask[h // g]
        m = s.max()
        p = np.exp(s - m)
        lse[h] = m + np.log(p.sum())
        out[h] = (p / p.sum()) @ values[:, h // g, :].astype(np.float64)
    return out, lse


@pytest.fixture(autouse=True)
def _print_seed():
    print(f"seed {SEED}")
    yield
