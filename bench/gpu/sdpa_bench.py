#!/usr/bin/env python3
"""Decode-attention latency of PyTorch's scaled_dot_product_attention (fp16 dense K/V, one query
token per sequence, GQA) on the shapes e8kv-gpu-bench measures, and the table that sets both
side by side.

    python3 bench/gpu/sdpa_bench.py [--quick] [--csv sdpa.csv] [--ours e8kv-gpu-bench.csv]

Backend: pinned to FlashAttention; a shape flash refuses falls back to memory-efficient
attention, then cuDNN, then the math backend (only if its score matrix fits); the backend used
is printed per shape. GQA goes through enable_gqa (torch >= 2.5); older torch expands K/V
beforehand (outside the timing; the row says so). A shape whose tensors (plus the math
backend's scores, if it comes to that) do not fit in free device memory is skipped.
Timing: the median of individually timed calls (CUDA events) after warm-up; when one copy of
K/V is smaller than 2 x 60 MB (the L2), copies rotate call by call so no call runs from L2.
With --ours, prints one row per shape: SDPA, our fp16 path, k2v2 and k3v2 as the default Config
stores them (RoPE-residual keys: the tensor-core kernel), k2v2-post (post-RoPE keys) and k2v2-pre
(pre-RoPE keys: the lane kernel) latencies (us), % of 4.3 TB/s, and the speed-ups of k2v2 and
k3v2 over SDPA.
"""
import argparse
import csv
import math
import statistics
import sys

HBM_BYTES_PER_S = 4.3e12
ROTATION_BYTES = 120e6


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def median_us(fn, torch, budget_ms, copies):
    """Median of individually timed calls fn(i) (i picks the buffer copy)."""
    for i in range(3):
        fn(i % copies)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(0)
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    iters = max(9, min(101, int(budget_ms / one)))
    times = []
    for i in range(iters):
        start.record()
        fn(i % copies)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times) * 1e3


def backends(torch):
    """The SDPA backends to try, in order, as (name, context-manager factory)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: the older switch
        cm = torch.backends.cuda.sdp_kernel
        return [("flash", lambda: cm(enable_flash=True, enable_math=False, enable_mem_efficient=False)),
                ("efficient", lambda: cm(enable_flash=False, enable_math=False, enable_mem_efficient=True)),
                ("math", lambda: cm(enable_flash=False, enable_math=True, enable_mem_efficient=False))]
    out = [("flash", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])),
           ("efficient", lambda: sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]))]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        out.append(("cudnn", lambda: sdpa_kernel([SDPBackend.CUDNN_ATTENTION])))
    out.append(("math", lambda: sdpa_kernel([SDPBackend.MATH])))
    return out


def run_sdpa(args):
    import torch
    import torch.nn.functional as F

    rows = []
    dev = torch.device("cuda")
    kinds = backends(torch)
    print(f"sdpa: torch {torch.__version__} on {torch.cuda.get_device_name(0)}, {args.kv_heads} KV heads, fp16, "
          f"median latency per call")
    for d in parse_list(args.dims):
        for gqa in parse_list(args.gqa):
            for batch in parse_list(args.batches):
                for ctx in parse_list(args.contexts):
                    hq, hk = args.kv_heads * gqa, args.kv_heads
                    kv_bytes = 2 * batch * hk * ctx * d * 2
                    copies = max(1, math.ceil(ROTATION_BYTES / kv_bytes))
                    free, _ = torch.cuda.mem_get_info()
                    if copies * kv_bytes * 1.1 > free:
                        print(f"  ctx {ctx:6d} batch {batch:2d} d {d:3d} gqa {gqa}: skipped "
                              f"({copies * kv_bytes / 1e9:.1f} GB of K/V, {free / 1e9:.1f} GB free)")
                        continue
                    q = torch.randn(batch, hq, 1, d, dtype=torch.float16, device=dev)
                    ks = [torch.randn(batch, hk, ctx, d, dtype=torch.float16, device=dev) for _ in range(copies)]
                    vs = [torch.randn(batch, hk, ctx, d, dtype=torch.float16, device=dev) for _ in range(copies)]
                    result, note = None, ""
                    for name, ctxmgr in kinds:
                        if name == "math" and batch * hq * ctx * 4 * 3 > 0.5 * torch.cuda.mem_get_info()[0]:
                            continue  # the math backend's score matrices would not fit
                        try:
                            with ctxmgr():
                                try:
                                    call = lambda i: F.scaled_dot_product_attention(q, ks[i], vs[i], enable_gqa=True)
                                    call(0)
                                except TypeError:  # torch < 2.5: no enable_gqa; expand once, outside the timing
                                    ks = [k.repeat_interleave(gqa, dim=1) for k in ks]
                                    vs = [v.repeat_interleave(gqa, dim=1) for v in vs]
                                    call = lambda i: F.scaled_dot_product_attention(q, ks[i], vs[i])
                                    call(0)
                                    note = " (K/V expanded: reads gqa x the bytes)"
                                us = median_us(call, torch, args.budget_ms, copies)
                            result = (name, us)
                            break
                        except RuntimeError:
                            torch.cuda.synchronize()
                            continue
                    if result is None:
                        print(f"  ctx {ctx:6d} batch {batch:2d} d {d:3d} gqa {gqa}: skipped (no backend accepts it)")
                    else:
                        name, us = result
                        pct = 100.0 * kv_bytes / (us * 1e-6) / HBM_BYTES_PER_S
                        print(f"  ctx {ctx:6d} batch {batch:2d} d {d:3d} gqa {gqa}: {us:9.1f} us  {pct:5.1f}% HBM  "
                              f"[{name}]{note}")
                        rows.append(("sdpa", "fp16", d, gqa, batch, ctx, us, name))
                    del q, ks, vs
                    torch.cuda.empty_cache()
    return rows


def merged_table(sdpa_rows, ours_path):
    ours = {}
    with open(ours_path) as f:
        for r in csv.DictReader(f):
            if r["bench"] == "decode":
                key = (int(r["head_dim"]), int(r["gqa"]), int(r["batch"]), int(r["context"]))
                ours[(r["codec"],) + key] = (float(r["time_us"]), float(r.get("pct_hbm") or 0))
    print("\ndecode attention latency (us; lower is better), 8 KV heads, fp16 query/output; "
          "%HBM = bytes read / time against 4.3 TB/s")
    print(f"{'context':>7} {'batch':>5} {'d':>4} {'gqa':>3} {'sdpa':>9} {'fp16':>9} {'k2v2':>9} {'k3v2':>9} "
          f"{'k2v2-post':>9} {'k2v2-pre':>9} {'k2v2 %HBM':>9} {'k2v2/sdpa':>9} {'k3v2/sdpa':>9}")
    for (_, _, d, gqa, batch, ctx, us, _) in sdpa_rows:
        key = (d, gqa, batch, ctx)
        got = {c: ours.get((c,) + key) for c in ("fp16", "k2v2", "k3v2", "k2v2-post", "k2v2-pre")}
        f = lambda c: f"{got[c][0]:9.1f}" if got[c] else f"{'-':>9}"
        sp = lambda c: f"{us / got[c][0]:9.2f}" if got[c] else f"{'-':>9}"
        pct = f"{got['k2v2'][1]:8.1f}%" if got["k2v2"] else f"{'-':>9}"
        print(f"{ctx:7d} {batch:5d} {d:4d} {gqa:3d} {us:9.1f} {f('fp16')} {f('k2v2')} {f('k3v2')} {f('k2v2-post')} "
              f"{f('k2v2-pre')} {pct} {sp('k2v2')} {sp('k3v2')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="4096,16384,32768,131072")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dims", default="128")
    ap.add_argument("--gqa", default="4,8")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--budget-ms", type=float, default=25.0)
    ap.add_argument("--quick", action="store_true", help="contexts 4096,32768; batches 1,8; d 128; gqa 4")
    ap.add_argument("--csv", help="write one row per shape")
    ap.add_argument("--ours", help="CSV of e8kv-gpu-bench --csv: print the merged table")
    args = ap.parse_args()
    if args.quick:
        args.contexts, args.batches, args.dims, args.gqa = "4096,32768", "1,8", "128", "4"
    try:
        import torch
    except ImportError:
        print("sdpa: torch is not installed: skipping")
        return 0
    if not torch.cuda.is_available():
        print("sdpa: no CUDA device visible to torch: skipping")
        return 0
    rows = run_sdpa(args)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["bench", "codec", "head_dim", "gqa", "batch", "context", "time_us", "backend"])
            w.writerows(rows)
    if args.ours:
        merged_table(rows, args.ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
