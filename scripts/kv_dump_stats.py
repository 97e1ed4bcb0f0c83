#!/usr/bin/env python3
"""Statistics of a KV dump (e8kv-eval --dump-kv DIR) behind two design choices (docs/accuracy.md):

1. query-weighted keys: the factor by which per-RoPE-pair key scaling with the Cauchy-Schwarz
   optimum s_j = (w_j / sigma_j^2)^(1/4) lowers the expected q.k error, per layer;
2. 8-bit gains: how far each (layer, head)'s centred key/value norms stray from their geometric
   mean, in octaves (the code covers +-4);
3. the key mean's RoPE term (attention's cos/sin dot product, as many multiply-adds per key as the
   code's own): how much query-weighted energy the residuals would gain if the mean kept only its
   K strongest pairs and the codes carried the rest (a mean on fewer pairs would make that dot
   product shorter).

Usage: kv_dump_stats.py DIR [n_layers n_kv_heads n_q_heads head_dim]   (needs numpy)
Defaults match SmolLM2-135M (30 layers, 3 KV heads, 9 query heads, head_dim 64; adjacent pairs).
"""
import sys

import numpy as np


def main():
    d = sys.argv[1]
    L, H, Q, D = (int(x) for x in sys.argv[2:6]) if len(sys.argv) >= 6 else (30, 3, 9, 64)
    G = Q // H
    gains, spans = [], []
    kept = (D // 16, D // 8, D // 4, D // 8 * 3)  # of the D / 2 pairs
    sparse = {K: [] for K in kept}
    mean_share = []
    for layer in range(L):
        k = np.load(f"{d}/layer{layer}_keys_pre_rope.npy").reshape(-1, H, D)
        v = np.load(f"{d}/layer{layer}_values.npy").reshape(-1, H, D)
        q = np.load(f"{d}/layer{layer}_queries_obs.npy").reshape(-1, Q, D)
        row = []
        for h in range(H):
            kh = k[4:, h, :] - k[4:68, h, :].mean(0)  # after the 4 sinks, centred on the mean tokens
            sig = (kh[:, 0::2] ** 2 + kh[:, 1::2] ** 2).mean(0)  # adjacent RoPE pairs
            qh = q[:, h * G:(h + 1) * G, :].reshape(-1, D)
            w = (qh[:, 0::2] ** 2 + qh[:, 1::2] ** 2).mean(0)
            row.append(sig.sum() * w.sum() / np.sqrt(sig * w).sum() ** 2)
            # 3: the mean over every token after the sinks, per pair; residual energy per pair.
            mu = k[4:, h, :].mean(0)
            m2 = mu[0::2] ** 2 + mu[1::2] ** 2
            r = k[4:, h, :] - mu
            s2 = (r[:, 0::2] ** 2 + r[:, 1::2] ** 2).mean(0)
            mean_share.append((w * m2).sum() / (w * s2).sum())
            order = np.argsort(-(w * m2))
            for K in kept:
                sparse[K].append((w * m2)[order[K:]].sum() / (w * s2).sum())
            for x in (kh, v[4:, h, :] - v[4:68, h, :].mean(0)):
                n = np.linalg.norm(x, axis=1)
                lg = np.log2(n[n > 0])
                spans.append(np.abs(lg - lg[:200].mean()).max())
        gains.append(row)
    g = np.array(gains)
    print("query weighting, q.k error reduction per layer (mean over heads):", [round(float(x), 2) for x in g.mean(1)])
    print("range %.2f-%.2fx, geometric mean %.2fx" % (g.mean(1).min(), g.mean(1).max(), np.exp(np.log(g).mean())))
    print("centred norms: largest distance from a head's geometric mean %.2f octaves" % max(spans))
    ms = np.array(mean_share)
    print("key mean's query-weighted energy / the residuals': median %.2f, range %.2f-%.2f" %
          (np.median(ms), ms.min(), ms.max()))
    for K in kept:
        x = np.array(sparse[K])
        print("mean on its %d strongest of %d pairs: residual energy (query-weighted) +%.1f %% median, "
              "+%.1f %% at the 90th percentile, +%.1f %% at most" %
              (K, D // 2, 100 * np.median(x), 100 * np.percentile(x, 90), 100 * x.max()))


if __name__ == "__main__":
    main()
