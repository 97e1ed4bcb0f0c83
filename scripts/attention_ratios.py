#!/usr/bin/env python3
"""Same-run ratios of e8kv-attention-bench: every row's time over the dense fp16 HND baseline
(BM_DenseFp16/.../hnd:1) of the same token count, cache temperature, query tokens and thread
count, from one JSON output.

  build/dev/bench/attention/e8kv-attention-bench --benchmark_repetitions=3 \
      --benchmark_enable_random_interleaving=true --benchmark_out=out.json
  python3 scripts/attention_ratios.py out.json

Uses the median of the repetitions when the run has them (real time, milliseconds); a row
whose baseline is missing from the run is printed without a ratio. Standard library only.
"""
import json
import re
import statistics
import sys
from collections import defaultdict


def main(path):
    with open(path) as f:
        data = json.load(f)
    times = defaultdict(list)
    labels = {}
    order = []
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b["name"])
        if name not in times:
            order.append(name)
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
        times[name].append(b["real_time"] * scale)
        if b.get("label"):
            labels[name] = f"{b['label']} ({name})"
    med = {n: statistics.median(v) for n, v in times.items()}

    def key(name):
        tokens = re.search(r"tokens:(\d+)", name)
        cold = re.search(r"cold:(\d+)", name)
        queries = re.search(r"queries:(\d+)", name)
        threads = re.search(r"threads:(\d+)", name)
        return (tokens.group(1) if tokens else None, cold.group(1) if cold else None,
                queries.group(1) if queries else "1", threads.group(1) if threads else "1")

    base = {}
    for n in order:
        if n.startswith("BM_DenseFp16/") and "/hnd:1" in n:
            base[key(n)] = med[n]
    ctx = data.get("context", {})
    print(f"# {ctx.get('date', '')} {ctx.get('host_name', '')}, {ctx.get('num_cpus', '?')} CPUs, "
          f"{ctx.get('mhz_per_cpu', '?')} MHz; medians of {max(len(v) for v in times.values())} repetitions")
    print("| benchmark | ms (median) | min-max | vs dense fp16 HND, same tokens, temperature, query tokens and threads "
          "| threads: speed-up over the same row with one thread |")
    print("|---|---|---|---|---|")
    kernels = [n for n in order if n.startswith("BM_AttendKernel/")]
    for n in sorted(set(order) - set(kernels)):
        b = base.get(key(n))
        ratio = f"{med[n] / b:.2f}x" if b else ""
        scaling = ""
        threads = re.search(r"threads:(\d+)", n)
        if threads and threads.group(1) != "1":
            one = med.get(n.replace(f"threads:{threads.group(1)}", "threads:1"))
            scaling = f"{one / med[n]:.2f}x" if one else ""
        print(f"| {n} | {med[n]:.2f} | {min(times[n]):.2f}-{max(times[n]):.2f} | {ratio} | {scaling} |")
    if kernels:  # BM_AttendKernel: one inner loop over a few tokens in L1, per stored token
        print()
        print("| kernel, data in L1 (one KV head, its query heads) | ns per stored token (median) | min-max |")
        print("|---|---|---|")
        for n in sorted(kernels):
            tokens = int(re.search(r"tokens:(\d+)", n).group(1))
            per_token = [t * 1e6 / tokens for t in times[n]]
            print(f"| {labels.get(n, n)} | {statistics.median(per_token):.1f} | {min(per_token):.1f}-{max(per_token):.1f} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: attention_ratios.py <e8kv-attention-bench JSON output>")
    main(sys.argv[1])
