#!/usr/bin/env python3
"""Static cost report of e8kv's CUDA kernels: how a kernel change is judged without a GPU.

    python3 scripts/kernel_cost.py [--check] [--objects BUILD] [--out report.md] [--json report.json]

Takes the sm_90 cubins of the kernel instantiations (kernels/*.cu) and of the scenario
instantiations (scripts/kernel_cost.cu): from a Release CMake build's objects with --objects
(configured with -DE8KV_CUDA=ON -DE8KV_KERNEL_COST=ON; what CI does, so nothing is compiled twice
and the report reads the code the library ships), or compiled here with the same device flags.
Reads `cuobjdump -res-usage`, disassembles the cubins with nvdisasm (line info with inlining) and
prints, per kernel:

  regs, local-memory bytes (the STL/LDL instructions' widths: spills plus local arrays), stack,
  static shared memory, threads per CTA, CTAs/SM and occupancy on an H200 (sm_90: 64K registers
  and 228 KB shared memory per SM, 4 sub-partitions);
  the hot path in warp-instructions per token-head, and a roofline estimate.

Hot path. A kernel marks its hot code in the source with a `cost-report:` comment:
  "per-token loop"   the loop whose back edge is on the marked line (decode attention): the
                     longest path through one trip of the loop body (inner loops once);
  "per-vector path"  a statement every vector's path runs through (encode, dequantize): the
                     shortest path from the kernel's entry through that line to an exit (the
                     common path; the exhaustive E8P fallback and other rare branches are off it),
                     and the longest (each loop once) as an upper bound.
  "per-open-block pass"  a statement inside the warp-shared exhaustive search's loop (encode):
                     one trip of the innermost loop holding it is one open block's search,
                     shared by the whole warp (the longest trip over the kernel's copies, e.g. the
                     two stages of Rvq3/Rvq4). Its inner loops must be slice loops, marked
                     "search slice trip, N per lane": they count N trips each. How often a pass
                     runs depends on the data (open blocks: ~0.1-0.4 % of Gaussian blocks,
                     tests/codebook/search_fallback_test).
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
MARKER_RE = re.compile(r"cost-report:\s*(per-token loop|per-vector path|per-open-block pass|search slice trip, \d+ per lane)")


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


# ---- cubins: compiled here, or taken from a CMake build's objects ----------------------------------


def compile_cubin(nvcc, src, out_dir):
    """src compiled for sm_90 with the library's Release device flags (CMakeLists.txt: -O3 -DNDEBUG
    -lineinfo --expt-relaxed-constexpr)."""
    name = os.path.splitext(os.path.basename(src))[0]
    cubin = os.path.join(out_dir, name + ".cubin")
    cmd = [nvcc, "-cubin", f"-arch={ARCH}", "-O3", "-DNDEBUG", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo",
           "-Xcompiler=-ffp-contract=off", "-DE8KV_HAS_CUDA=1", "-I", os.path.join(ROOT, "include"),
           os.path.join(ROOT, src), "-o", cubin]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CostError(f"nvcc failed on {src}:\n{r.stderr[-3000:]}")
    return cubin, time.time() - t0


# Where a CMake build keeps the objects of kernels/*.cu (target e8kv_cuda) and of the scenarios
# (target e8kv_kernel_cost_scenarios, built when E8KV_KERNEL_COST=ON), relative to the build dir.
OBJECT_GLOBS = {"kernels": os.path.join("CMakeFiles", "e8kv_cuda.dir", "kernels", "*.cu.o"),
                "scenarios": os.path.join("CMakeFiles", "e8kv_kernel_cost_scenarios.dir", "scripts", "kernel_cost.cu.o")}


def cubins_from_build(build, tools, out_dir):
    """[(source, cubin)]: the sm_90 cubins inside a CMake build's kernel and scenario objects, so the
    report reads the code the library ships and CI compiles nothing twice."""
    import glob
    cache = os.path.join(build, "CMakeCache.txt")
    if not os.path.exists(cache):
        raise CostError(f"--objects {build}: no CMakeCache.txt (not a CMake build directory)")
    with open(cache) as fh:
        m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", fh.read(), re.M)
    if not m or m.group(1).strip() != "Release":
        raise CostError(f"--objects {build}: CMAKE_BUILD_TYPE is {m.group(1).strip() if m else 'unset'!r}; "
                        "the report reads Release objects only (the flags the thresholds were set with)")
    found = []
    for kind, pattern in OBJECT_GLOBS.items():
        objs = sorted(glob.glob(os.path.join(build, pattern)))
        if not objs:
            hint = " (configure with -DE8KV_KERNEL_COST=ON and build)" if kind == "scenarios" else \
                " (configure with -DE8KV_CUDA=ON and build)"
            raise CostError(f"--objects {build}: no {kind} object {pattern}{hint}")
        for obj in objs:
            src = ("kernels/" + os.path.basename(obj)[:-2]) if kind == "kernels" else "scripts/kernel_cost.cu"
            where = os.path.join(out_dir, os.path.basename(obj)[:-2])
            os.makedirs(where, exist_ok=True)
            for old in os.listdir(where):
                os.remove(os.path.join(where, old))
            r = subprocess.run([tools["cuobjdump"], "-xelf", "all", os.path.abspath(obj)], cwd=where,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise CostError(f"cuobjdump -xelf all {obj}: {r.stderr.strip()}")
            cubins = [f for f in os.listdir(where) if f.endswith(f".{ARCH}.cubin")]
            if len(cubins) != 1:
                raise CostError(f"{obj}: {len(cubins)} {ARCH} cubins inside (configure with "
                                f"CMAKE_CUDA_ARCHITECTURES containing {ARCH[3:]})")
            found.append((src, os.path.join(where, cubins[0])))
    return found


# ---- resources: cuobjdump -res-usage, local-memory traffic from the SASS --------------------------


def parse_res_usage(text):
    """{mangled name: {regs, stack, smem}} from `cuobjdump -res-usage`. Its SHARED is the size of the
    kernel's .nv.shared section, which on sm_90 holds 1 KB more than the kernel's own static shared
    memory whenever it has any (ptxas -v reports the kernel's own; the driver's per-CTA reservation
    is added in occupancy()); smem here is the kernel's own, as ptxas reports it."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^\s*Function (\S+):\s*$", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", line)
        if m and current:
            shared = int(m.group(3))
            if 0 < shared < SMEM_RESERVED_PER_CTA:
                raise CostError(f"{current}: SHARED:{shared}, below the {SMEM_RESERVED_PER_CTA} B every kernel with "
                                "shared memory carries on sm_90 (cuobjdump's accounting changed?)")
            out[current] = {"regs": int(m.group(1)), "stack": int(m.group(2)),
                            "smem": shared - SMEM_RESERVED_PER_CTA if shared else 0}
            current = None
    return out


LOCAL_ACCESS_RE = re.compile(r"^(STL|LDL)((?:\.\w+)*)$")


def local_bytes(func):
    """Bytes moved by the function's local-memory instructions (STL + LDL widths, each counted once
    in the code): register spills plus local arrays. For a kernel without local arrays it equals
    ptxas -v's "spill stores + spill loads" (2026-12-02: compared kernel by kernel on the head_dim 64
    tensor-core instantiations, and every decode scenario kept its ptxas figure)."""
    total = 0
    for _, text, _ in func.ins:
        m = LOCAL_ACCESS_RE.match(opcode(text))
        if not m:
            continue
        mods = m.group(2).split(".")
        total += 16 if "128" in mods else 8 if "64" in mods else 1 if ("U8" in mods or "S8" in mods) else \
            2 if ("U16" in mods or "S16" in mods) else 4
    return total


MAX_THREADS_RE = re.compile(r"^\.nv\.info\.(\S+)|EIATTR_MAX_THREADS\s*\n\s*Format:[^\n]*\n\s*Value:\s*(0x[0-9a-fA-F]+)", re.M)


def parse_max_threads(elf_text):
    """{mangled name: threads per CTA} from the EIATTR_MAX_THREADS (__launch_bounds__) attributes
    (one regex pass: `cuobjdump -elf` prints ~10^5 lines per cubin)."""
    out, current = {}, None
    for m in MAX_THREADS_RE.finditer(elf_text):
        if m.group(1):
            current = m.group(1)
        elif current and current not in out:
            out[current] = int(m.group(2), 16)
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
    """{(file basename, line): kind} of every cost-report marker under include/e8kv/cuda and
    include/e8kv/codebook (the warp-shared search)."""
    found = {}
    for root, _, files in [w for sub in ("cuda", "codebook") for w in os.walk(os.path.join(ROOT, "include", "e8kv", sub))]:
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


def loop_trip(f, cfg, callees, head, latch, longest=True):
    """Blocks of the loop head..latch and its longest (or shortest) trip, inner loops once."""
    lo, hi = cfg.blocks[head][0], cfg.blocks[latch][1]
    region = {k for k, (s, e) in enumerate(cfg.blocks) if lo <= s and e <= hi}
    best = dag_paths(cfg, {head}, region, lambda k: False, block_cost_fn(cfg, callees, longest), longest)
    if latch not in best:
        raise CostError(f"{f.name}: a loop latch is not reachable from its header")
    return region, best[latch]


def innermost_loop(cfg, i):
    """(head, latch) of the smallest loop whose range holds instruction i, or None."""
    around = [(cfg.blocks[k][1] - cfg.blocks[v][0], v, k) for k in range(len(cfg.blocks)) for v in cfg.succ[k]
              if cfg.is_back_edge(k, v) and cfg.blocks[v][0] <= i < cfg.blocks[k][1]]
    return min(around)[1:] if around else None


def open_block_pass(f, cfg, callees, marked, slice_marks):
    """Warp-instructions of one open block's pass: the longest trip of the innermost loop around
    each per-open-block marker, with each inner slice loop counted for its N trips (N from its
    marker); the largest over the kernel's copies, and how many copies there are."""
    slice_loops = {}  # (head, latch) of a slice loop -> trips
    for i, trips in slice_marks:
        loop = innermost_loop(cfg, i)
        if loop is None:
            raise CostError(f"{f.name}: search slice marker outside any loop")
        slice_loops[loop] = trips
    passes = {}
    for i in marked:
        loop = innermost_loop(cfg, i)
        if loop is None:
            raise CostError(f"{f.name}: per-open-block marker outside any loop")
        if loop in passes:
            continue
        head, latch = loop
        region, once = loop_trip(f, cfg, callees, head, latch)
        total = once
        for k in region:
            for v in cfg.succ[k]:
                if v in region and cfg.is_back_edge(k, v) and (k, v) != (latch, head):
                    if (v, k) not in slice_loops:
                        raise CostError(f"{f.name}: an open-block pass holds a loop without a slice marker "
                                        "(unknown trip count)")
                    total += (slice_loops[(v, k)] - 1) * loop_trip(f, cfg, callees, v, k)[1]
        passes[loop] = total
    return max(passes.values()), len(passes)


def analyse_hot_path(f, markers):
    """The hot-path figures of one function, or None when it has no marked line."""
    cfg = Cfg(f)
    callees = callee_costs(cfg)
    hits = {}
    for i, (_, _, chain) in enumerate(f.ins):
        for key in chain:
            if key in markers:
                hits.setdefault(markers[key], []).append(i)
    res = analyse_loop_or_vector(f, cfg, callees, hits)
    if res is not None and "per-open-block pass" in hits:
        slice_marks = [(i, int(re.search(r"(\d+) per lane", kind).group(1)))
                       for kind, idx in hits.items() if kind.startswith("search slice trip") for i in idx]
        res["open_block_pass"], res["open_block_loops"] = open_block_pass(f, cfg, callees, hits["per-open-block pass"],
                                                                          slice_marks)
    return res


def analyse_loop_or_vector(f, cfg, callees, hits):
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
        region, longest_trip = loop_trip(f, cfg, callees, head, latch, True)
        inner = sum(1 for k in region for v in cfg.succ[k] if v in region and cfg.is_back_edge(k, v) and (k, v) != (latch, head))
        res = {"kind": "loop", "static": cfg.blocks[latch][1] - cfg.blocks[head][0], "inner_loops": inner,
               "max": longest_trip, "min": loop_trip(f, cfg, callees, head, latch, False)[1]}
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


def analyse_cubin(src, cubin, tools, markers, scenarios):
    """The report rows of one cubin's kernels (entries): resources, hot path, roofline."""
    rows = []
    usage = subprocess.run([tools["cuobjdump"], "-res-usage", cubin], capture_output=True, text=True)
    if usage.returncode != 0:
        raise CostError(f"cuobjdump -res-usage {cubin}: {usage.stderr.strip()}")
    elf = subprocess.run([tools["cuobjdump"], "-elf", cubin], capture_output=True, text=True)
    if elf.returncode != 0:
        raise CostError(f"cuobjdump -elf {cubin}: {elf.stderr.strip()}")
    threads = parse_max_threads(elf.stdout)
    entries = set(re.findall(r"^\.nv\.info\.(\S+)", elf.stdout, re.M))
    res = {k: v for k, v in parse_res_usage(usage.stdout).items() if k in entries}
    sass = subprocess.run([tools["nvdisasm"], "-gi", "-c", cubin], capture_output=True, text=True)
    if sass.returncode != 0:
        raise CostError(f"nvdisasm {cubin}: {sass.stderr.strip()}")
    funcs = parse_sass(sass.stdout)
    names = demangle(sorted(res))
    for mangled, r in sorted(res.items(), key=lambda kv: names[kv[0]]):
        t = threads.get(mangled)
        if t is None:
            raise CostError(f"{mangled}: no __launch_bounds__ (EIATTR_MAX_THREADS) in the cubin")
        if mangled not in funcs:
            raise CostError(f"{mangled}: no code in nvdisasm's output of {cubin}")
        ctas, occ, limiter = occupancy(r["regs"], r["smem"], t)
        scenario = scenarios.get(mangled)
        row = {"kernel": mangled if scenario else short_name(names[mangled]), "source": src,
               "scenario": bool(scenario), "what": scenario["what"] if scenario else "",
               "regs": r["regs"], "local_bytes": local_bytes(funcs[mangled]), "stack": r["stack"],
               "smem": r["smem"], "threads": t, "ctas_per_sm": ctas, "occupancy": occ, "limiter": limiter}
        hot = analyse_hot_path(funcs[mangled], markers)
        per_step = scenario["vectors_per_step"] if scenario else vectors_per_warp_step(row["kernel"])
        if hot and per_step:
            row.update(hot_kind=hot["kind"], hot_static=hot["static"], hot_inner_loops=hot["inner_loops"],
                       path_min=hot["min"], path_max=hot["max"], instr_per_token_head=hot["path"] / per_step,
                       instr_per_token_head_max=hot["max"] / per_step)
            if "open_block_pass" in hot:
                row.update(open_block_pass=hot["open_block_pass"], open_block_loops=hot["open_block_loops"])
        if scenario and "instr_per_token_head" in row:
            row["bytes_per_token_head"] = scenario["bytes"]
            row.update(roofline(row["instr_per_token_head"], scenario["bytes"]))
        rows.append(row)
    return rows


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
    if args.objects:
        srcs_cubins = cubins_from_build(args.objects, tools, args.build_dir)
        log(f"read {len(srcs_cubins)} objects of {args.objects} ({ARCH} cubins)")
    else:
        srcs = args.sources.split(",") if args.sources else sources()
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(compile_cubin, nvcc, src, args.build_dir) for src in srcs]
            compiled = [fut.result() for fut in futures]
        for src, (_, secs) in zip(srcs, compiled):
            log(f"compiled {src} for {ARCH} in {secs:.0f} s")
        srcs_cubins = [(src, cubin) for src, (cubin, _) in zip(srcs, compiled)]
    srcs = [src for src, _ in srcs_cubins]
    # One cubin per worker process (disassembly and path analysis are the step's cost).
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(analyse_cubin, src, cubin, tools, markers, scenarios) for src, cubin in srcs_cubins]
        rows = [row for fut in futures for row in fut.result()]
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
           "| scenario | regs | local B | stack | smem | CTAs/SM | occ. | hot path instr/token-head (max) | B/token-head | "
           "budget instr | HBM % | 32K x 8 heads floor us |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if not r["scenario"]:
            continue
        out.append(f"| {r['what']} | {r['regs']} | {r['local_bytes']} | {r['stack']} | {r['smem']} | {r['ctas_per_sm']} | "
                   f"{100 * r['occupancy']:.1f} % | {fmt(r.get('instr_per_token_head'), 1)} "
                   f"({fmt(r.get('instr_per_token_head_max'), 1)}) | {fmt(r.get('bytes_per_token_head'), 1)} | "
                   f"{fmt(r.get('budget_instr'), 1)} | {fmt(r.get('hbm_pct'), 1)} | {fmt(r.get('floor_us_32k_8h'), 1)} |")
    out += ["", "Decode: one trip of the per-token loop for a coded token (longest path), per token-head (G query "
            "heads each). Encode/dequantize: the common path of one vector (shortest through the marked store; max: "
            "longest, loops once). Budget: instructions per token-head the HBM time of its bytes allows. HBM %: share "
            "of 4.3 TB/s reachable if instruction issue were the only other limit. Floor: 32K tokens x 8 KV heads at "
            "that rate.", "",
            "## Kernels (kernels/*.cu, as launched)", "",
            "| kernel | regs | local B | stack | smem | threads | CTAs/SM | occ. | limiter | hot path | instr/token-head "
            "(max) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    for r in rows:
        if r["scenario"]:
            continue
        hot = {"loop": "per-token loop", "vector": "per vector"}.get(r.get("hot_kind"), "-")
        out.append(f"| `{r['kernel']}` | {r['regs']} | {r['local_bytes']} | {r['stack']} | {r['smem']} | {r['threads']} | "
                   f"{r['ctas_per_sm']} | {100 * r['occupancy']:.1f} % | {r['limiter']} | {hot} | "
                   f"{fmt(r.get('instr_per_token_head'), 1)} ({fmt(r.get('instr_per_token_head_max'), 1)}) |")
    shared = [r for r in rows if r.get("open_block_pass") is not None]
    if shared:
        out += ["", "## Warp-shared exhaustive search (encode): one open block", "",
                "| kernel | loops | warp-instructions per open block (longest) |", "| --- | ---: | ---: |"]
        for r in shared:
            label = r["what"] if r["scenario"] else f"`{r['kernel']}`"
            out.append(f"| {label} | {r['open_block_loops']} | {r['open_block_pass']:.0f} |")
        out += ["", "A block the quick searches leave open (~0.1-0.4 % of Gaussian blocks) costs its warp one such "
                "pass; the encode paths above (common path; max: each loop once) count none or one."]
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
            for key, field, sense in (("max_regs", "regs", "<="), ("max_local_bytes", "local_bytes", "<="),
                                      ("max_stack", "stack", "<="), ("max_smem", "smem", "<="),
                                      ("min_ctas_per_sm", "ctas_per_sm", ">="),
                                      ("max_instr_per_token_head", "instr_per_token_head", "<="),
                                      ("max_open_block_pass", "open_block_pass", "<=")):
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
    ap.add_argument("--objects", metavar="CMAKE_BUILD_DIR",
                    help="read the sm_90 cubins of a Release CMake build's kernel and scenario objects "
                    "(-DE8KV_CUDA=ON -DE8KV_KERNEL_COST=ON, CMAKE_CUDA_ARCHITECTURES containing 90) instead of "
                    "compiling: what CI does after the test build")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build", "kernel_cost"),
                    help="where cubins are written (compiled, or extracted from --objects)")
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
