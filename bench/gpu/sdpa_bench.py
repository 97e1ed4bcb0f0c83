#!/usr/bin/env python3
"""Decode-attention latency of PyTorch's scaled_dot_product_attention (fp16 dense K/V, one query
token per sequence, GQA through enable_gqa) on the shapes e8kv-gpu-bench measures, and the table
that sets both side by side.

    python3 bench/gpu/sdpa_bench.py [--quick] [--csv sdpa.csv] [--ours e8kv-gpu-bench.csv]

With --ours, prints one row per shape: SDPA, our fp16 path, k2v2 and k3v2 latencies (us) and the
speed-ups of k2v2 and k3v2 over SDPA. Timing: CUDA events, mean over enough calls to fill
--budget-ms after one warm-up call.
"""
import argparse
import csv
import sys


def parse_list(text):
    return [int(x) for x in text.split(",") if x]


def time_us(fn, torch, budget_ms):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    iters = max(3, min(200, int(budget_ms / one)))
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3


def run_sdpa(args):
    import torch
    import torch.nn.functional as F

    rows = []
    dev = torch.device("cuda")
    print(f"sdpa: torch {torch.__version__} on {torch.cuda.get_device_name(0)}, {args.kv_heads} KV heads, fp16")
    for d in parse_list(args.dims):
        for gqa in parse_list(args.gqa):
            for batch in parse_list(args.batches):
                for ctx in parse_list(args.contexts):
                    q = torch.randn(batch, args.kv_heads * gqa, 1, d, dtype=torch.float16, device=dev)
                    k = torch.randn(batch, args.kv_heads, ctx, d, dtype=torch.float16, device=dev)
                    v = torch.randn(batch, args.kv_heads, ctx, d, dtype=torch.float16, device=dev)
                    us = time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), torch, args.budget_ms)
                    print(f"  ctx {ctx:6d} batch {batch:2d} d {d:3d} gqa {gqa}: {us:9.1f} us")
                    rows.append(("sdpa", "fp16", d, gqa, batch, ctx, us))
                    del q, k, v
                    torch.cuda.empty_cache()
    return rows


def merged_table(sdpa_rows, ours_path):
    ours = {}
    with open(ours_path) as f:
        for r in csv.DictReader(f):
            if r["bench"] == "decode":
                key = (int(r["head_dim"]), int(r["gqa"]), int(r["batch"]), int(r["context"]))
                ours[(r["codec"],) + key] = float(r["time_us"])
    print("\ndecode attention latency (us; lower is better), 8 KV heads, fp16 query/output")
    print(f"{'context':>7} {'batch':>5} {'d':>4} {'gqa':>3} {'sdpa':>9} {'fp16':>9} {'k2v2':>9} {'k3v2':>9}"
          f" {'k2v2/sdpa':>9} {'k3v2/sdpa':>9}")
    for (_, _, d, gqa, batch, ctx, us) in sdpa_rows:
        key = (d, gqa, batch, ctx)
        f16, k2, k3 = (ours.get((c,) + key) for c in ("fp16", "k2v2", "k3v2"))
        fmt = lambda x: f"{x:9.1f}" if x else f"{'-':>9}"
        sp = lambda x: f"{us / x:9.2f}" if x else f"{'-':>9}"
        print(f"{ctx:7d} {batch:5d} {d:4d} {gqa:3d} {us:9.1f} {fmt(f16)} {fmt(k2)} {fmt(k3)} {sp(k2)} {sp(k3)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="4096,16384,32768,131072")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--gqa", default="4,8")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--budget-ms", type=float, default=40.0)
    ap.add_argument("--quick", action="store_true", help="contexts 4096,32768; batches 1,8; d 128; gqa 4")
    ap.add_argument("--csv", help="write one row per shape")
    ap.add_argument("--ours", help="CSV of e8kv-gpu-bench --csv: print the merged table")
    args = ap.parse_args()
    if args.quick:
        args.contexts, args.batches, args.dims, args.gqa = "4096,32768", "1,8", "128", "4"
    try:
        import torch  # noqa: F401
    except ImportError:
        print("sdpa: torch is not installed: skipping")
        return 0
    rows = run_sdpa(args)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["bench", "codec", "head_dim", "gqa", "batch", "context", "time_us"])
            w.writerows(rows)
    if args.ours:
        merged_table(rows, args.ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
