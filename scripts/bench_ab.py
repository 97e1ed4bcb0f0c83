#!/usr/bin/env python3
"""A/B of Google Benchmark binaries on a noisy host: runs each binary in turn, round after round,
pinned to one core, and prints per benchmark and binary the minimum and the median real time over
every repetition of every round (the minimum is what the code can do; the median, what a run
meets). Two builds of the same bench at two commits is the intended use:

  python3 scripts/bench_ab.py --filter 'k3v2_residual/tokens:4096/cold:0/threads:1/queries:1$' \\
      --rounds 4 old/e8kv-attention-bench new/e8kv-attention-bench

Standard library only; needs `taskset` (util-linux) for --cpu.
"""
import argparse
import json
import os
import statistics
import subprocess


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--filter", required=True, help="--benchmark_filter for every binary")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repetitions", type=int, default=3, help="repetitions per binary per round")
    ap.add_argument("--min-time", default="0.2", help="--benchmark_min_time per repetition")
    ap.add_argument("--cpu", default="1", help="core to pin to (taskset -c); empty: no pinning")
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    times = {}
    for _ in range(a.rounds):
        for b in a.binaries:
            cmd = ([("taskset"), "-c", a.cpu] if a.cpu else []) + [
                b, f"--benchmark_filter={a.filter}", f"--benchmark_min_time={a.min_time}",
                f"--benchmark_repetitions={a.repetitions}", "--benchmark_format=json"]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            for x in json.loads(out)["benchmarks"]:
                if x.get("run_type") == "iteration":
                    times.setdefault((x["run_name"], b), []).append((x["real_time"], x.get("time_unit", "ns")))
    names = sorted({n for n, _ in times})
    print(f"| benchmark | binary | min | median | runs |")
    print("|---|---|---|---|---|")
    for n in names:
        for b in a.binaries:
            v = times.get((n, b))
            if not v:
                continue
            unit = v[0][1]
            t = [x for x, _ in v]
            print(f"| {n} | {b} | {min(t):.3f} {unit} | {statistics.median(t):.3f} {unit} | {len(t)} |")


if __name__ == "__main__":
    main()
