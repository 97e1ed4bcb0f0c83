#!/usr/bin/env python3
"""Static cost report of e8kv's CUDA kernels: how a kernel change is judged without a GPU.

    python3 scripts/kernel_cost.py [--check] [--out report.md] [--json report.json]

Compiles the kernel instantiations (kernels/*.cu) and the scenario instantiations
(scripts/kernel_cost.cu) for sm_90 with `-Xptxas -v -lineinfo`, reads ptxas's resource usage,
disassembles the cubins with nvdisasm (line info with inlining) and prints, per kernel:

  regs, spill bytes, stack, static shared memory, threads per CTA, CTAs/SM and occupancy on an
  H200 (sm_90: 64K registers and 228 KB shared memory per SM, 4 sub-partitions);
  the hot path in warp-instructions per token-head, and a roofline estimate.

Hot path. A kernel marks its hot code in the source with a `cost-report:` comment:
  "per-token loop"   the loop whose back edge is on the marked line (decode attention): the
                     longest path through one trip of the loop body (inner loops once);
  "per-vector path"  a statement every vector's path runs through (encode, dequantize): the
                     shortest path from the kernel's entry through that line to an exit (the
                     common path; the exhaustive E8P fallback and other rare branches are off it),
                     and the longest (each loop once) as an upper bound.
A CALL counts the instructions of its callee's corresponding path. Paths are divided by the
vectors a warp handles per step (32 / (D/8) for D/8-lane groups) to give warp-instructions per
token-head. The real kernels decide the group size, value codec, RoPE mode and dtype at run time,
so their paths hold every case; the scenarios of scripts/kernel_cost.cu fix one launch's values
and are what the roofline rows and the --check instruction limits use.

Roofline (per token-head, H200): memory time = bytes / 4.3 TB/s; issue time = warp-instructions
/ (132 SMs x 4 schedulers x 1.98 GHz), i.e. one warp-instruction per scheduler per cycle, with
latency hidden. "HBM %" = memory time / max(memory, issue): the share of HBM bandwidth the hot
path could reach if issue were the only other limit (an upper bound: only the hot loop counts).

--check compares against scripts/kernel_cost_thresholds.json and exits 1 on a regression.
Exit codes: 0 done (also when nvcc is absent: nothing to measure, said on stdout), 1 a threshold
failed, 2 a real error (compile failure, tools missing and not installable, a marker not found).
nvdisasm and cuobjdump come from the toolkit when it has them, else from PyPI
(nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump, pinned below) in a venv under ~/.cache/e8kv,
installed only when missing.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# PyPI builds of the two disassemblers (none matches nvcc 13.0 exactly; 13.2.51 is the oldest
# published and reads sm_90 cubins of 13.0).
TOOL_PINS = {"nvdisasm": "nvidia-cuda-nvdisasm==13.2.51", "cuobjdump": "nvidia-cuda-cuobjdump==13.2.51"}
TOOLS_VENV = os.path.join(os.path.expanduser("~"), ".cache", "e8kv", "cuda-tools")

# H200 SXM (sm_90).
ARCH = "sm_90"
SMS = 132
SCHEDULERS = 4
CLOCK_HZ = 1.98e9
HBM_BYTES_PER_S = 4.3e12
REGS_PER_SM = 65536
REGS_PER_CTA = 65536
SUB_PARTITIONS = 4
REG_ALLOC_UNIT = 256  # registers per warp are allocated in units of 256
MAX_WARPS_PER_SM = 64
MAX_CTAS_PER_SM = 32
SMEM_PER_SM = 233472  # 228 KB at the largest carveout
SMEM_RESERVED_PER_CTA = 1024
SMEM_ALLOC_UNIT = 128
ISSUE_PER_S = SMS * SCHEDULERS * CLOCK_HZ

def sources():
    """kernels/*.cu (every instantiation the library ships), then the scenarios, largest first."""
    kernels = sorted((os.path.join("kernels", f) for f in os.listdir(os.path.join(ROOT, "kernels")) if f.endswith(".cu")),
                     key=lambda f: -os.path.getsize(os.path.join(ROOT, f)))
    return kernels + ["scripts/kernel_cost.cu"]
MARKER_RE = re.compile(r"cost-report:\s*(per-token loop|per-vector path)")


class CostError(Exception):
    """A real error: the report cannot be produced."""


# ---- tools -------------------------------------------------------------------------------------


def find_nvcc(explicit):
    if explicit:
        return explicit if shutil.which(explicit) or os.path.exists(explicit) else None
    for cand in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.exists(cand):
            return cand
    return None


def venv_tool(name):
    for root, _, files in os.walk(os.path.join(TOOLS_VENV, "lib")):
        if name in files and os.path.basename(root) == "bin":
            return os.path.join(root, name)
    return None


def find_tool(name, nvcc):
    for cand in (shutil.which(name), os.path.join(os.path.dirname(nvcc), name), venv_tool(name)):
        if cand and os.path.exists(cand):
            return cand
    return None


def ensure_tools(nvcc, log):
    """nvdisasm and cuobjdump, installing the pinned PyPI builds into the venv when missing."""
    tools = {n: find_tool(n, nvcc) for n in TOOL_PINS}
    missing = [n for n, p in tools.items() if p is None]
    if missing:
        log(f"installing {', '.join(TOOL_PINS[n] for n in missing)} into {TOOLS_VENV}")
        py = os.path.join(TOOLS_VENV, "bin", "python")
        try:
            if not os.path.exists(py):
                subprocess.run([sys.executable, "-m", "venv", TOOLS_VENV], check=True, capture_output=True, text=True)
            subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] +
                           [TOOL_PINS[n] for n in missing], check=True, capture_output=True, text=True)
        except (subprocess.CalledProcessError, OSError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            raise CostError(f"cannot install {missing} from PyPI: {detail.strip()[-400:]}")
        tools = {n: find_tool(n, nvcc) for n in TOOL_PINS}
        if any(p is None for p in tools.values()):
            raise CostError(f"installed {missing} but cannot find the binaries under {TOOLS_VENV}")
    return tools


# ---- compile and parse ptxas ---------------------------------------------------------------------


def compile_cubin(nvcc, src, out_dir):
    name = os.path.splitext(os.path.basename(src))[0]
    cubin = os.path.join(out_dir, name + ".cubin")
    cmd = [nvcc, "-cubin", f"-arch={ARCH}", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo",
           "-Xptxas", "-v", "-Xcompiler=-ffp-contract=off", "-DE8KV_HAS_CUDA=1", "-I", os.path.join(ROOT, "include"),
           os.path.join(ROOT, src), "-o", cubin]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CostError(f"nvcc failed on {src}:\n{r.stderr[-3000:]}")
    return cubin, r.stderr, time.time() - t0


def parse_ptxas(text):
    """{mangled name: {regs, spill_stores, spill_loads, stack, smem, barriers}} of entry functions."""
    out, current, entries = {}, None, set()
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entries.add(m.group(1))
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = m.group(1)
            out.setdefault(current, {"regs": 0, "spill_stores": 0, "spill_loads": 0, "stack": 0, "smem": 0})
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and current:
            out[current].update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            out[current]["smem"] = int(s.group(1)) if s else 0
            c = re.search(r"(\d+) bytes cumulative stack size", line)
            if c:
                out[current]["stack"] = max(out[current]["stack"], int(c.group(1)))
    return {k: v for k, v in out.items() if k in entries}


def parse_max_threads(elf_text):
    """{mangled name: threads per CTA} from the EIATTR_MAX_THREADS (__launch_bounds__) attributes."""
    out, current, want = {}, None, False
    for line in elf_text.splitlines():
        m = re.match(r"^\.nv\.info\.(\S+)", line.strip())
        if m:
            current, want = m.group(1), False
            continue
        if "EIATTR_MAX_THREADS" in line:
            want = True
            continue
        if want and current and line.strip().startswith("Value:"):
            out[current] = int(line.split()[1], 16)
            want = False
    return out


def demangle(names):
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    r = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True)
    lines = r.stdout.splitlines()
    return {n: (lines[i] if i < len(lines) else n) for i, n in enumerate(names)}


def short_name(demangled):
    s = demangled.replace("e8kv::cuda::detail::", "").replace("e8kv::codebook::", "")
    s = re.sub(r"\(e8kv::cuda::detail::\w+\)$|\(\w+\)$", "", s)
    s = s.replace("void ", "")
    return s


# ---- SASS: instructions, blocks, paths -------------------------------------------------------------


class Function:
    def __init__(self, name):
        self.name = name
        self.ins = []  # (address, text, chain: tuple of (file basename, line))
        self.labels = {}  # label -> instruction index


INSTR_RE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
LINE_RE = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
LABEL_RE = re.compile(r"^([.$][\w.$]+):\s*$")


def parse_sass(text):
    funcs, f, chain, pending = {}, None, (), []
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):\s*$", line)
        if m:
            f = funcs[m.group(1)] = Function(m.group(1))
            chain, pending = (), []
            continue
        if f is None:
            continue
        m = LINE_RE.search(line)
        if m:
            pending.append((os.path.basename(m.group(1)), int(m.group(2))))
            if m.group(3):
                pending.append((os.path.basename(m.group(3)), int(m.group(4))))
            continue
        m = LABEL_RE.match(line.strip())
        if m:
            f.labels[m.group(1)] = len(f.ins)
            continue
        m = INSTR_RE.match(line)
        if m:
            if pending:
                chain, pending = tuple(pending), []
            f.ins.append((int(m.group(1), 16), m.group(2), chain))
    return funcs


BRANCH_TARGET_RE = re.compile(r"`\(([^)]+)\)")


def opcode(text):
    t = re.sub(r"^@!?U?P\w+\s+", "", text)
    return t.split()[0] if t else ""


def predicated(text):
    return text.startswith("@")


class Cfg:
    """Basic blocks of one function with successor lists and per-block costs."""

    def __init__(self, f):
        self.f = f
        n = len(f.ins)
        leaders = {0} | set(f.labels.values())
        for i, (_, t, _) in enumerate(f.ins):
            op = opcode(t)
            if op.startswith(("BRA", "EXIT", "RET", "BRX", "JMP", "JMX", "BREAK")):
                leaders.add(i + 1)
        self.starts = sorted(x for x in leaders if x < n)
        self.block_of = {}
        self.blocks = []  # (start, end)
        for k, s in enumerate(self.starts):
            e = self.starts[k + 1] if k + 1 < len(self.starts) else n
            self.blocks.append((s, e))
            for i in range(s, e):
                self.block_of[i] = k
        self.succ = []
        self.calls = []  # per block: callee labels
        for k, (s, e) in enumerate(self.blocks):
            last = f.ins[e - 1][1]
            op = opcode(last)
            succ = []
            target = BRANCH_TARGET_RE.search(last)
            tk = self.block_of.get(f.labels.get(target.group(1), -1)) if target else None
            falls = e < n
            if op.startswith("BRA") or op.startswith("JMP"):
                if tk is not None:
                    succ.append(tk)
                # BRA.DIV / BRA.CONV branch on the warp's convergence (the slow path of a
                # shuffle): conditional like a predicated branch.
                if (predicated(last) or ".DIV" in op or ".CONV" in op) and falls:
                    succ.append(k + 1)
            elif op.startswith(("EXIT", "RET")):
                if predicated(last) and falls:
                    succ.append(k + 1)
            elif op.startswith(("BRX", "JMX")):
                pass  # indirect: not produced by our kernels; treated as an exit
            elif falls:
                succ.append(k + 1)
            self.succ.append(sorted(set(succ)))
            callees = []
            for i in range(s, e):
                if opcode(f.ins[i][1]).startswith("CALL"):
                    c = BRANCH_TARGET_RE.search(f.ins[i][1])
                    if c and c.group(1) in f.labels:
                        callees.append(c.group(1))
            self.calls.append(callees)

    def is_back_edge(self, u, v):
        return self.blocks[v][0] <= self.blocks[u][0]

    def is_exit(self, k):
        s, e = self.blocks[k]
        op = opcode(self.f.ins[e - 1][1])
        return op.startswith("EXIT") and not predicated(self.f.ins[e - 1][1])

    def is_ret(self, k):
        s, e = self.blocks[k]
        return opcode(self.f.ins[e - 1][1]).startswith("RET")


def dag_paths(cfg, sources, allowed, is_sink, block_cost, longest):
    """Best path cost from any source to every block over forward edges inside `allowed`."""
    best = {}
    order = sorted(allowed, key=lambda k: cfg.blocks[k][0])
    INF = float("inf")
    for k in order:
        if k in sources:
            best[k] = max(best.get(k, -INF), block_cost(k)) if longest else min(best.get(k, INF), block_cost(k))
        if k not in best:
            continue
        if is_sink(k):
            continue
        for v in cfg.succ[k]:
            if v not in allowed or cfg.is_back_edge(k, v):
                continue
            cand = best[k] + block_cost(v)
            if v not in best or (cand > best[v] if longest else cand < best[v]):
                best[v] = cand
    return best


def callee_costs(cfg):
    """(shortest, longest) instruction counts of each CALL target, entry label to RET."""
    out = {}
    for label, idx in cfg.f.labels.items():
        if not label.startswith("$"):
            continue
        start = cfg.block_of.get(idx)
        if start is None:
            continue
        region = set()
        stack = [start]
        while stack:
            k = stack.pop()
            if k in region:
                continue
            region.add(k)
            if not cfg.is_ret(k):
                stack.extend(v for v in cfg.succ[k] if not cfg.is_back_edge(k, v))
        size = lambda k: cfg.blocks[k][1] - cfg.blocks[k][0]
        res = []
        for longest in (False, True):
            best = dag_paths(cfg, {start}, region, cfg.is_ret, size, longest)
            rets = [best[k] for k in region if cfg.is_ret(k) and k in best]
            res.append((min(rets) if not longest else max(rets)) if rets else 0)
        out[label] = tuple(res)
    return out


def block_cost_fn(cfg, callees, longest):
    def cost(k):
        s, e = cfg.blocks[k]
        return (e - s) + sum(callees.get(c, (0, 0))[1 if longest else 0] for c in cfg.calls[k])
    return cost


def marker_lines():
    """{(file basename, line): kind} of every cost-report marker under include/e8kv/cuda."""
    found = {}
    base = os.path.join(ROOT, "include", "e8kv", "cuda")
    for root, _, files in os.walk(base):
        for fn in files:
            if not fn.endswith((".cuh", ".hpp")):
                continue
            with open(os.path.join(root, fn)) as fh:
                lines = fh.read().splitlines()
            for i, text in enumerate(lines):
                m = MARKER_RE.search(text)
                if not m:
                    continue
                code = text[: text.index("//")].strip() if "//" in text else text.strip()
                found[(fn, i + 1 if code else i + 2)] = m.group(1)
    return found


def analyse_hot_path(f, markers):
    """The hot-path figures of one function, or None when it has no marked line."""
    cfg = Cfg(f)
    callees = callee_costs(cfg)
    hits = {}
    for i, (_, _, chain) in enumerate(f.ins):
        for key in chain:
            if key in markers:
                hits.setdefault(markers[key], []).append(i)
    if "per-token loop" in hits:
        marked = set(hits["per-token loop"])
        loops = []
        for k, (s, e) in enumerate(cfg.blocks):
            for v in cfg.succ[k]:
                if cfg.is_back_edge(k, v) and (e - 1) in marked:
                    loops.append((v, k))
        if not loops:
            raise CostError(f"{f.name}: per-token loop marker found but no back edge carries its line")
        # Unswitched copies of the loop: the largest one is the coded-token loop.
        head, latch = max(loops, key=lambda hl: cfg.blocks[hl[1]][1] - cfg.blocks[hl[0]][0])
        lo, hi = cfg.blocks[head][0], cfg.blocks[latch][1]
        region = {k for k, (s, e) in enumerate(cfg.blocks) if lo <= s and e <= hi}
        inner = sum(1 for k in region for v in cfg.succ[k] if v in region and cfg.is_back_edge(k, v) and (k, v) != (latch, head))
        res = {"kind": "loop", "static": hi - lo, "inner_loops": inner}
        for longest in (True, False):
            best = dag_paths(cfg, {head}, region, lambda k: False, block_cost_fn(cfg, callees, longest), longest)
            if latch not in best:
                raise CostError(f"{f.name}: the loop latch is not reachable from its header")
            res["max" if longest else "min"] = best[latch]
        res["path"] = res["max"]  # one trip of a coded token: every uniform branch the heavy way
        return res
    if "per-vector path" in hits:
        marked_blocks = {cfg.block_of[i] for i in hits["per-vector path"]}
        # Called subroutines ($__internal_*) are reached only by CALL, never by an edge from the
        # entry: paths from block 0 stay in the kernel's own code.
        main = set(range(len(cfg.blocks)))
        allowed = main
        res = {"kind": "vector", "static": len(f.ins),
               "inner_loops": sum(1 for k in allowed for v in cfg.succ[k] if cfg.is_back_edge(k, v))}
        for longest in (False, True):
            cost = block_cost_fn(cfg, callees, longest)
            to = dag_paths(cfg, {0}, main, cfg.is_exit, cost, longest)
            # Paths from each marked block to an exit: reverse DAG over the same edges.
            best_out = {}
            for k in sorted(main, key=lambda k: -cfg.blocks[k][0]):
                if cfg.is_exit(k):
                    best_out[k] = cost(k)
                    continue
                cands = [best_out[v] for v in cfg.succ[k] if v in best_out and not cfg.is_back_edge(k, v)]
                if cands:
                    best_out[k] = cost(k) + (max(cands) if longest else min(cands))
            totals = [to[k] + best_out[k] - cost(k) for k in marked_blocks if k in to and k in best_out]
            if not totals:
                raise CostError(f"{f.name}: no path from the entry through the per-vector marker to an exit")
            res["max" if longest else "min"] = max(totals) if longest else min(totals)
        res["path"] = res["min"]  # the common path
        return res
    return None


# ---- occupancy and roofline ---------------------------------------------------------------------


def occupancy(regs, smem, threads):
    warps = max(1, math.ceil(threads / 32))
    regs_per_warp = math.ceil(regs * 32 / REG_ALLOC_UNIT) * REG_ALLOC_UNIT if regs > 0 else 0
    if regs_per_warp:
        if regs_per_warp * math.ceil(warps / SUB_PARTITIONS) * SUB_PARTITIONS > REGS_PER_CTA:
            by_regs = 0
        else:
            by_regs = (REGS_PER_SM // SUB_PARTITIONS // regs_per_warp) * SUB_PARTITIONS // warps
    else:
        by_regs = MAX_CTAS_PER_SM
    smem_alloc = math.ceil((smem + SMEM_RESERVED_PER_CTA) / SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT
    by_smem = SMEM_PER_SM // smem_alloc
    by_warps = MAX_WARPS_PER_SM // warps
    ctas = min(by_regs, by_smem, by_warps, MAX_CTAS_PER_SM)
    limiter = min((by_regs, "regs"), (by_smem, "smem"), (by_warps, "warps"), (MAX_CTAS_PER_SM, "ctas"))[1]
    return ctas, ctas * warps / MAX_WARPS_PER_SM, limiter


def roofline(instr_per_th, bytes_per_th):
    t_mem = bytes_per_th / HBM_BYTES_PER_S
    t_issue = instr_per_th / ISSUE_PER_S
    return {
        "budget_instr": t_mem * ISSUE_PER_S,
        "hbm_pct": 100.0 * t_mem / max(t_mem, t_issue) if instr_per_th > 0 else 100.0,
        "floor_us_32k_8h": 32768 * 8 * max(t_mem, t_issue) * 1e6,
    }


def read_scenarios():
    out = {}
    with open(os.path.join(ROOT, "scripts", "kernel_cost.cu")) as fh:
        for line in fh:
            m = re.match(r"//\s*cost-scenario:\s*(.*)$", line)
            if not m:
                continue
            parts = [p.strip() for p in m.group(1).split("|")]
            if len(parts) != 5:
                raise CostError(f"malformed cost-scenario line: {line.strip()}")
            out[parts[0]] = {"what": parts[1], "vectors_per_step": float(parts[2]), "bytes": float(parts[3]),
                             "family": parts[4]}
    return out


ROTATED_TILE_TOKENS = 16  # kRotTileTokens: a warp's tile of the tensor-core decode kernel


def vectors_per_warp_step(name):
    """Token-heads (or vectors) one warp handles per trip of its hot path: a 16-token tile for the
    tensor-core decode kernel, 32 / (D/8) vectors for the D/8-lane kernels."""
    if name.startswith("rotated_attention_split_kernel<"):
        return ROTATED_TILE_TOKENS
    m = re.search(r"<(\d+),", name)
    return 32 / (int(m.group(1)) // 8) if m else None


# ---- report --------------------------------------------------------------------------------------


def measure(args, log):
    nvcc = find_nvcc(args.nvcc)
    if nvcc is None:
        return None
    tools = ensure_tools(nvcc, log)
    os.makedirs(args.build_dir, exist_ok=True)
    markers = marker_lines()
    if not markers:
        raise CostError("no cost-report markers under include/e8kv/cuda")
    scenarios = read_scenarios()
    srcs = args.sources.split(",") if args.sources else sources()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(compile_cubin, nvcc, src, args.build_dir) for src in srcs]
        compiled = [fut.result() for fut in futures]
    rows = []
    for src, (cubin, ptxas_text, secs) in zip(srcs, compiled):
        log(f"compiled {src} for {ARCH} in {secs:.0f} s")
        res = parse_ptxas(ptxas_text)
        elf = subprocess.run([tools["cuobjdump"], "-elf", cubin], capture_output=True, text=True)
        if elf.returncode != 0:
            raise CostError(f"cuobjdump -elf {cubin}: {elf.stderr.strip()}")
        threads = parse_max_threads(elf.stdout)
        sass = subprocess.run([tools["nvdisasm"], "-gi", "-c", cubin], capture_output=True, text=True)
        if sass.returncode != 0:
            raise CostError(f"nvdisasm {cubin}: {sass.stderr.strip()}")
        funcs = parse_sass(sass.stdout)
        names = demangle(sorted(res))
        for mangled, r in sorted(res.items(), key=lambda kv: names[kv[0]]):
            t = threads.get(mangled)
            if t is None:
                raise CostError(f"{mangled}: no __launch_bounds__ (EIATTR_MAX_THREADS) in the cubin")
            ctas, occ, limiter = occupancy(r["regs"], r["smem"], t)
            scenario = scenarios.get(mangled)
            row = {"kernel": mangled if scenario else short_name(names[mangled]), "source": src,
                   "scenario": bool(scenario), "what": scenario["what"] if scenario else "",
                   "regs": r["regs"], "spill_bytes": r["spill_stores"] + r["spill_loads"], "stack": r["stack"],
                   "smem": r["smem"], "threads": t, "ctas_per_sm": ctas, "occupancy": occ, "limiter": limiter}
            hot = analyse_hot_path(funcs[mangled], markers) if mangled in funcs else None
            per_step = scenario["vectors_per_step"] if scenario else vectors_per_warp_step(row["kernel"])
            if hot and per_step:
                row.update(hot_kind=hot["kind"], hot_static=hot["static"], hot_inner_loops=hot["inner_loops"],
                           path_min=hot["min"], path_max=hot["max"], instr_per_token_head=hot["path"] / per_step,
                           instr_per_token_head_max=hot["max"] / per_step)
            if scenario and "instr_per_token_head" in row:
                row["bytes_per_token_head"] = scenario["bytes"]
                row.update(roofline(row["instr_per_token_head"], scenario["bytes"]))
            rows.append(row)
    missing = sorted(set(scenarios) - {r["kernel"] for r in rows if r["scenario"]})
    if missing and "scripts/kernel_cost.cu" in srcs:
        raise CostError(f"scenarios without a kernel in the cubin: {missing}")
    for r in rows:
        if r["scenario"] and "instr_per_token_head" not in r:
            raise CostError(f"scenario {r['kernel']}: no hot path found (cost-report marker missing?)")
    return {"arch": ARCH, "nvcc": subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip()
            .splitlines()[-1], "tools": {k: os.path.relpath(v, os.path.expanduser("~")) if v.startswith(
                os.path.expanduser("~")) else v for k, v in tools.items()}, "rows": rows}


def fmt(x, nd=0):
    if x is None:
        return "-"
    return f"{x:.{nd}f}"


def markdown(report):
    rows = report["rows"]
    out = [f"# e8kv kernel cost report ({report['arch']}, static, no device)", "",
           f"{report['nvcc']}; H200 model: {SMS} SMs x {SCHEDULERS} schedulers at {CLOCK_HZ / 1e9:.2f} GHz, "
           f"{HBM_BYTES_PER_S / 1e12:.1f} TB/s HBM.", "",
           "## Scenarios (one launch's uniform parameters fixed: scripts/kernel_cost.cu)", "",
           "| scenario | regs | spill B | stack | smem | CTAs/SM | occ. | hot path instr/token-head (max) | B/token-head | "
           "budget instr | HBM % | 32K x 8 heads floor us |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if not r["scenario"]:
            continue
        out.append(f"| {r['what']} | {r['regs']} | {r['spill_bytes']} | {r['stack']} | {r['smem']} | {r['ctas_per_sm']} | "
                   f"{100 * r['occupancy']:.1f} % | {fmt(r.get('instr_per_token_head'), 1)} "
                   f"({fmt(r.get('instr_per_token_head_max'), 1)}) | {fmt(r.get('bytes_per_token_head'), 1)} | "
                   f"{fmt(r.get('budget_instr'), 1)} | {fmt(r.get('hbm_pct'), 1)} | {fmt(r.get('floor_us_32k_8h'), 1)} |")
    out += ["", "Decode: one trip of the per-token loop for a coded token (longest path), per token-head (G query "
            "heads each). Encode/dequantize: the common path of one vector (shortest through the marked store; max: "
            "longest, loops once). Budget: instructions per token-head the HBM time of its bytes allows. HBM %: share "
            "of 4.3 TB/s reachable if instruction issue were the only other limit. Floor: 32K tokens x 8 KV heads at "
            "that rate.", "",
            "## Kernels (kernels/*.cu, as launched)", "",
            "| kernel | regs | spill B | stack | smem | threads | CTAs/SM | occ. | limiter | hot path | instr/token-head "
            "(max) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for r in rows:
        if r["scenario"]:
            continue
        hot = {"loop": "per-token loop", "vector": "per vector"}.get(r.get("hot_kind"), "-")
        out.append(f"| `{r['kernel']}` | {r['regs']} | {r['spill_bytes']} | {r['stack']} | {r['smem']} | {r['threads']} | "
                   f"{r['ctas_per_sm']} | {100 * r['occupancy']:.1f} % | {r['limiter']} | {hot} | "
                   f"{fmt(r.get('instr_per_token_head'), 1)} ({fmt(r.get('instr_per_token_head_max'), 1)}) |")
    out += ["", "Real kernels decide G, the value codec, RoPE mode and dtype at run time: their decode loop path is "
            "the heaviest case (G = 8 and the heaviest value decoder), an upper bound. smem is static shared memory: "
            "the head_dim 256 instantiations of rotated_attention_split_kernel take theirs dynamically (52-68 KB, "
            "not shown; they are register-limited to 2 CTAs/SM anyway).", ""]
    return "\n".join(out)


def check(report, thresholds_path):
    with open(thresholds_path) as fh:
        th = json.load(fh)
    failures, checked = [], 0
    rows = report["rows"]
    for rule in th.get("rules", []):
        pattern = re.compile(rule["match"])
        matched = [r for r in rows if pattern.search(r["kernel"])]
        if not matched:
            failures.append(f"rule {rule['match']!r} matches no kernel (renamed? update {os.path.basename(thresholds_path)})")
            continue
        for r in matched:
            for key, field, sense in (("max_regs", "regs", "<="), ("max_spill_bytes", "spill_bytes", "<="),
                                      ("max_stack", "stack", "<="), ("max_smem", "smem", "<="),
                                      ("min_ctas_per_sm", "ctas_per_sm", ">="),
                                      ("max_instr_per_token_head", "instr_per_token_head", "<=")):
                if key not in rule:
                    continue
                checked += 1
                value = r.get(field)
                if value is None:
                    failures.append(f"{r['kernel']}: {field} unknown (limit {key} {rule[key]})")
                elif (sense == "<=" and value > rule[key] + 1e-9) or (sense == ">=" and value < rule[key]):
                    failures.append(f"{r['kernel']}: {field} {value:.1f} {'>' if sense == '<=' else '<'} "
                                    f"{key} {rule[key]}")
    return checked, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the thresholds file; exit 1 on a regression")
    ap.add_argument("--thresholds", default=os.path.join(ROOT, "scripts", "kernel_cost_thresholds.json"))
    ap.add_argument("--out", help="write the markdown report here too")
    ap.add_argument("--json", help="write the figures as JSON")
    ap.add_argument("--nvcc", help="nvcc to use (default: PATH, then /usr/local/cuda/bin)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "kernel_cost"))
    ap.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    ap.add_argument("--from-json", help="report (and --check) the figures of an earlier --json run, compiling nothing")
    ap.add_argument("--sources", help="comma-separated sources to compile instead of all (development; --check then "
                    "fails the rules that match nothing)")
    args = ap.parse_args()
    log = lambda msg: print(f"[kernel_cost] {msg}", file=sys.stderr, flush=True)
    t0 = time.time()
    try:
        if args.from_json:
            with open(args.from_json) as fh:
                report = json.load(fh)
        else:
            report = measure(args, log)
    except (CostError, OSError, ValueError) as e:
        print(f"kernel_cost: error: {e}", file=sys.stderr)
        return 2
    if report is None:
        print("kernel_cost: nvcc not found: no CUDA toolkit, nothing to measure (skipped)")
        return 0
    text = markdown(report)
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    status = 0
    if args.check:
        checked, failures = check(report, args.thresholds)
        if failures:
            print(f"\nkernel_cost --check: {len(failures)} of {checked} limits exceeded "
                  f"({os.path.relpath(args.thresholds, ROOT)}):")
            for f in failures:
                print(f"  FAIL {f}")
            status = 1
        else:
            print(f"\nkernel_cost --check: all {checked} limits hold ({os.path.relpath(args.thresholds, ROOT)})")
    log(f"done in {time.time() - t0:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
