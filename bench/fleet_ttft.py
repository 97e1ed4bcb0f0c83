#!/usr/bin/env python3
"""Time to first token on a second llama-server for a repeated long prefix: recompute the prefill,
or fetch the prefix's KV cache from Redis and restore it (a raw slot file, or e8kv's compressed
value through `e8kv-llama-state pull`), over Redis's Unix socket and loopback TCP.

Run by bench/fleet_ttft.sh, which starts Redis and the two servers. Protocol, per repetition and
per method (interleaved, so drift hits every method alike):
  server A answered the PREFIX-token prefix once and saved its slot; that slot was stored raw in
  Redis (one SET) and pushed by `e8kv-llama-state push` once per preset;
  server B's slot is erased, then B is asked for the prefix + a 64-token suffix it never saw,
  n_predict 1 (greedy): TTFT is the wall time from the start of the fetch (or of the request, for
  recompute) to B's answer. B's first-token top-5 is compared with its own recomputed answer's.
Then KL on the same tokens: for --kl-suffixes different 64-token suffixes after the restored
prefix, KL(recomputed || restored) of B's next-token distribution, over the recomputed answer's
top-256 tokens plus one bucket for the rest (llama-server returns at most the top n_probs; the
tail bucket makes it a lower bound of the full KL, and the listed mass is printed).

Options for bench/fleet_link.sh (issue 48; without them the run and its table are as above):
  --transports unix|tcp|unix,tcp  which store paths get rows (setup traffic, the raw SET, the pushes
    and KL's pulls, always goes over --unix, untimed);
  --links "none 10gbit ..." with --link-cmd CMD: the rows are measured once per link, after
    `CMD RATE` set it (CMD's output, the link's measured figures, is printed then and again above
    the table, which gets a link column); the recompute row uses no network and is measured once,
    in the first link's pass; A's prefill and the pushes happen once;
  --memory SPEC@PORT_A,PORT_B,A_SLOTS,B_SLOTS (repeatable): a pair of servers started with
    --kv-e8kv SPEC: A_m answers the prefix and saves its slot (e8kv's codes), `push --kv-e8kv SPEC`
    stores them, and the rows "e8kv-memory SPEC" pull with --kv-e8kv SPEC, restore on B_m and
    answer on B_m, timed as the e8kv rows; their first token and KL are against f16 B's recompute.
Stdlib only."""
import math
import argparse
import json
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
import types
import urllib.request


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def resp(address, *args):
    """One Redis command over RESP (a raw slot file is a plain SET/GET: no e8kv in the path)."""
    if address.startswith("unix://"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(address[7:])
    else:
        host, port = address[len("redis://"):].rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
    with s:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += [b"$%d\r\n" % len(a), a, b"\r\n"]
        s.sendall(b"".join(out))
        f = s.makefile("rb")
        line = f.readline()
        if line.startswith(b"-"):
            raise RuntimeError(f"redis: {line.decode().strip()}")
        if line.startswith(b"$"):
            n = int(line[1:])
            return None if n < 0 else f.read(n + 2)[:-2]
        return line.strip()


def first_token_probs(answer):
    """[(id, token text, probability)] of the first generated token's listed alternatives, best
    first: llama-server lists them as top_logprobs (before sampling; older servers: probs)."""
    probs = answer.get("completion_probabilities") or []
    if not probs:
        return []
    first = probs[0]
    if "top_logprobs" in first:
        return [(x["id"], x["token"], math.exp(x["logprob"])) for x in first["top_logprobs"]]
    return [(x.get("id"), x.get("token", x.get("tok_str")), x.get("prob", 0.0))
            for x in first.get("top_probs") or first.get("probs") or []]


def top5(answer):
    return [(tok, p) for _, tok, p in first_token_probs(answer)[:5]]


def tool(args, *argv):
    """One e8kv-llama-state run; its stdout. Exits with its output when it fails or hangs."""
    try:
        out = subprocess.run([args.tool, *argv], capture_output=True, text=True, timeout=args.tool_timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"[ttft] FAIL: {argv[0]} ran past {args.tool_timeout} s: {' '.join(argv)}")
    if out.returncode != 0:
        sys.exit(f"[ttft] FAIL: {argv[0]} {' '.join(argv[-1:])} exit {out.returncode}: {out.stdout}{out.stderr}")
    return out.stdout


def parse_memory(ap, text):
    spec, _, rest = text.rpartition("@")  # a spec has commas of its own: the last @ ends it
    parts = rest.split(",")
    if not spec or len(parts) != 4:
        ap.error(f"--memory {text!r}: want SPEC@PORT_A,PORT_B,A_SLOTS_DIR,B_SLOTS_DIR")
    return types.SimpleNamespace(spec=spec, a=int(parts[0]), b=int(parts[1]), a_slots=parts[2], b_slots=parts[3],
                                 key=f"e8kv-memory {spec}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=int, required=True, help="server A's port")
    ap.add_argument("--b", type=int, required=True, help="server B's port")
    ap.add_argument("--b-slots", required=True, help="server B's --slot-save-path")
    ap.add_argument("--a-slots", required=True, help="server A's --slot-save-path")
    ap.add_argument("--unix", required=True, help="the store's Unix socket (rows, and all setup traffic)")
    ap.add_argument("--tcp", required=True)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--suffix", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kl-suffixes", type=int, default=16)
    ap.add_argument("--specs", default="preset=quant-k3v2;preset=tier-k3v2,scorer=key-key;preset=quant-k4v4")
    ap.add_argument("--transports", default="unix,tcp", help="the store paths that get rows: unix, tcp or both")
    ap.add_argument("--links", help='link settings, e.g. "none 10gbit 1gbit 100mbit": the rows once per link')
    ap.add_argument("--link-cmd", help="run as CMD RATE (split as a shell would, no shell) before each link's reps")
    ap.add_argument("--memory", action="append", default=[], metavar="SPEC@PORT_A,PORT_B,A_SLOTS,B_SLOTS",
                    help="servers started with --kv-e8kv SPEC (repeatable)")
    ap.add_argument("--tool-timeout", type=int, default=600, help="seconds per e8kv-llama-state run")
    args = ap.parse_args()
    specs = [s for s in args.specs.split(";") if s]
    transports = [t for t in args.transports.split(",") if t]
    if not transports or set(transports) - {"unix", "tcp"}:
        ap.error(f"--transports {args.transports!r}: unix, tcp or unix,tcp")
    links = args.links.replace(",", " ").split() if args.links else [None]
    if not links:
        ap.error("--links is empty")
    memory = [parse_memory(ap, m) for m in args.memory]

    text = open(args.text, encoding="utf-8").read()
    tokens = post(args.b, "/tokenize", {"content": text[: 8 * (args.prefix + (args.kl_suffixes + 4) * args.suffix)],
                                         "add_special": True})["tokens"]
    need = args.prefix + (args.kl_suffixes + 2) * args.suffix
    if len(tokens) < need:
        sys.exit(f"[ttft] the corpus gave {len(tokens)} tokens, need {need}")
    prefix = tokens[: args.prefix]
    # B's request: the prefix, then text B never saw (A saw none of it either).
    prompt_b = prefix + tokens[args.prefix + args.suffix: args.prefix + 2 * args.suffix]
    greedy = {"n_predict": 1, "temperature": 0, "cache_prompt": True, "id_slot": 0, "n_probs": 5,
              "samplers": ["top_k"], "top_k": 1}

    t = time.perf_counter()
    a = post(args.a, "/completion", {"prompt": prefix, **greedy})
    a_ms = (time.perf_counter() - t) * 1000
    post(args.a, "/slots/0?action=save", {"filename": "slot.bin"})
    slot_path = f"{args.a_slots}/slot.bin"
    raw = open(slot_path, "rb").read()
    print(f"[ttft] A prefilled {a['timings']['prompt_n']} tokens in {a_ms:.0f} ms; slot {len(raw):,} bytes", flush=True)
    resp(args.unix, "SET", "ttft:raw-slot", raw)

    pushed = {}
    for spec in specs:
        t = time.perf_counter()
        out = tool(args, "push", "--model", args.model, "--store", args.unix, "--config", spec,
                   "--chunk", str(args.chunk), "--ttl", "3600", slot_path)
        ms = (time.perf_counter() - t) * 1000
        value = int(out.split("-> value ")[1].split(" ")[0])
        pushed[spec] = value
        print(f"[ttft] push {spec}: {ms:.0f} ms: {out.strip()}", flush=True)
    for m in memory:  # the same prefix on A_m (--kv-e8kv), its slot's codes pushed as they are
        t = time.perf_counter()
        am = post(m.a, "/completion", {"prompt": prefix, **greedy})
        am_ms = (time.perf_counter() - t) * 1000
        post(m.a, "/slots/0?action=save", {"filename": "slot.bin"})
        m_slot = f"{m.a_slots}/slot.bin"
        with open(m_slot, "rb") as f:
            m_size = len(f.read())
        print(f"[ttft] A ({m.key}) prefilled {am['timings']['prompt_n']} tokens in {am_ms:.0f} ms; "
              f"slot {m_size:,} bytes", flush=True)
        t = time.perf_counter()
        out = tool(args, "push", "--model", args.model, "--store", args.unix, "--kv-e8kv", m.spec,
                   "--chunk", str(args.chunk), "--ttl", "3600", m_slot)
        ms = (time.perf_counter() - t) * 1000
        pushed[m.key] = int(out.split("-> value ")[1].split(" ")[0])
        print(f"[ttft] push {m.key}: {ms:.0f} ms: {out.strip()}", flush=True)

    # kind: how B gets the prefix; key: what was stored (bytes fetched, KL); port/slots: which B.
    method = lambda name, kind, key=None, tr=None, spec=None, port=args.b, slots=args.b_slots: \
        types.SimpleNamespace(name=name, kind=kind, key=key, tr=tr, spec=spec, port=port, slots=slots)
    methods = [method("recompute", "recompute")] + \
              [method(f"raw slot via {tr}", "raw", "raw slot", tr) for tr in transports] + \
              [method(f"{spec} via {tr}", "config", spec, tr, spec) for spec in specs for tr in transports] + \
              [method(f"{m.key} via {tr}", "memory", m.key, tr, m.spec, m.b, m.b_slots) for m in memory
               for tr in transports]
    rows = {(link, m.name): {"ttft": [], "fetch": [], "restore": [], "answer": [], "evaluated": [], "model": [],
                             "trips": [], "top": None}
            for link in links for m in methods}
    link_figures = {}

    for li, link in enumerate(links):
        if link is not None:
            if args.link_cmd:
                cmd = shlex.split(args.link_cmd) + [link]
                try:
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                except subprocess.TimeoutExpired:
                    sys.exit(f"[ttft] FAIL: the link command ran past 600 s: {cmd}")
                figures = (out.stdout + out.stderr).strip()
                if out.returncode != 0:
                    sys.exit(f"[ttft] FAIL: the link command {cmd} exit {out.returncode}: {figures}")
            else:
                figures = f"[ttft] link {link}: no --link-cmd, nothing was set"
            link_figures[link] = figures
            print(figures, flush=True)
        # The recompute row uses no network: measured in the first link's pass only.
        todo = [m for m in methods if m.kind != "recompute" or li == 0]
        for rep in range(args.reps):
            for m in todo:
                post(m.port, "/slots/0?action=erase", {})
                row = rows[(link, m.name)]
                store = args.unix if m.tr == "unix" else args.tcp
                t0 = time.perf_counter()
                if m.kind == "recompute":
                    t1 = t2 = t0
                elif m.kind == "raw":
                    data = resp(store, "GET", "ttft:raw-slot")
                    with open(f"{args.b_slots}/restored.bin", "wb") as f:
                        f.write(data)
                    t1 = time.perf_counter()
                    restored = post(args.b, "/slots/0?action=restore", {"filename": "restored.bin"})
                    t2 = time.perf_counter()
                    if restored["n_restored"] != len(prefix):
                        sys.exit(f"[ttft] FAIL: raw restore gave {restored['n_restored']} tokens")
                else:
                    with open(f"{m.slots}/prompt.json", "w") as f:
                        json.dump({"tokens": prompt_b}, f)
                    which = "--config" if m.kind == "config" else "--kv-e8kv"
                    out = subprocess.run([args.tool, "pull", "--model", args.model, "--store", store, which, m.spec,
                                          "--chunk", str(args.chunk), "--tokens-file", f"{m.slots}/prompt.json",
                                          f"{m.slots}/restored.bin"], capture_output=True, text=True,
                                         timeout=args.tool_timeout)
                    if out.returncode != 0:
                        sys.exit(f"[ttft] FAIL: pull {which} {m.spec} exit {out.returncode}: {out.stdout}{out.stderr}")
                    t1 = time.perf_counter()
                    pulled = int(out.stdout.split("restored ")[1].split(" ")[0])
                    row["model"].append(float(out.stdout.split("(model ")[1].split(" ms")[0]))
                    trips = re.search(r"(\d+) round trips", out.stdout)
                    if trips:
                        row["trips"].append(int(trips.group(1)))
                    restored = post(m.port, "/slots/0?action=restore", {"filename": "restored.bin"})
                    t2 = time.perf_counter()
                    if restored["n_restored"] != pulled or pulled != len(prefix):
                        sys.exit(f"[ttft] FAIL: pull wrote {pulled} tokens, B restored {restored['n_restored']}, "
                                 f"prefix {len(prefix)}")
                ans = post(m.port, "/completion", {"prompt": prompt_b, **greedy})
                t3 = time.perf_counter()
                row["ttft"].append((t3 - t0) * 1000)
                row["fetch"].append((t1 - t0) * 1000)
                row["restore"].append((t2 - t1) * 1000)
                row["answer"].append((t3 - t2) * 1000)
                row["evaluated"].append(ans["timings"]["prompt_n"])
                row["top"] = top5(ans)
                on = f" on {link}" if link is not None else ""
                print(f"[ttft] rep {rep + 1}/{args.reps} {m.name}{on}: {(t3 - t0) * 1000:.0f} ms "
                      f"(B evaluated {ans['timings']['prompt_n']} tokens)", flush=True)

    kl = quality(args, prefix, tokens, specs, memory, greedy) if args.kl_suffixes > 0 else {}  # 0: no KL pass

    base = statistics.median(rows[(links[0], "recompute")]["ttft"])
    ref = rows[(links[0], "recompute")]["top"]
    linked = links != [None]
    print()
    if linked:
        print("Links, as the link command set and measured them before their rows:")
        for link in links:
            print(f"  {link}: {link_figures[link]}")
        print(f"The recompute row uses no network: measured once, in the first link's pass ({links[0]}); "
              f"'vs recompute' divides its TTFT by each row's.")
        print()
    print(("| link " if linked else "") +
          f"| method | store | bytes fetched | TTFT ms | fetch ms | restore ms | B's answer ms (tokens evaluated) "
          f"| vs recompute | first token, p (recompute: {ref[0][0]!r} {ref[0][1]:.3f}) | KL |")
    print(("|---" if linked else "") + "|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    med = statistics.median
    for link in links:
        for m in methods:
            if m.kind == "recompute" and link != links[0]:
                continue
            r = rows[(link, m.name)]
            what = m.name.split(" via ")[0]
            size = "-" if m.kind == "recompute" else f"{len(raw):,}" if m.kind == "raw" else f"{pushed[m.key]:,}"
            ttft = med(r["ttft"])
            first = r["top"][0] if r["top"] else ("?", 0)
            same = "same" if first[0] == ref[0][0] else "DIFFERENT"
            notes = ([f"model load {med(r['model']):.0f}"] if r["model"] else []) + \
                    ([f"{int(med(r['trips']))} round trips"] if linked and r["trips"] else [])
            fetch = f"{med(r['fetch']):.0f}" + (f" ({', '.join(notes)})" if notes else "")
            where = ("- (once)" if m.kind == "recompute" else link) if linked else None
            print((f"| {where} " if linked else "") +
                  f"| {what} | {m.tr or '-'} | {size} | {ttft:.0f} ({min(r['ttft']):.0f}-{max(r['ttft']):.0f}) | "
                  f"{fetch} | {med(r['restore']):.0f} | {med(r['answer']):.0f} ({int(med(r['evaluated']))}) | "
                  f"{base / ttft:.2f}x | {same}, {first[1]:.3f} | {kl.get(m.key or what, '-')} |")


def quality(args, prefix, tokens, specs, memory, greedy):
    """KL(recomputed || restored) of B's next token after each of --kl-suffixes suffixes; the memory
    rows restore and answer on their own B_m, against the same f16 recomputed distributions."""
    n = 256
    suffixes = [tokens[args.prefix + (i + 2) * args.suffix: args.prefix + (i + 3) * args.suffix]
                for i in range(args.kl_suffixes)]
    ask = {**greedy, "n_probs": n}
    # Each method's slot file once (fetch time is measured above), restored before every suffix:
    # what -> (B's port, the slot file's name in B's --slot-save-path).
    with open(f"{args.a_slots}/slot.bin", "rb") as src, open(f"{args.b_slots}/slot.bin", "wb") as dst:
        dst.write(src.read())  # the raw slot: copied where B restores from
    files = {"raw slot": (args.b, "slot.bin")}
    pulls = [(spec, "--config", spec, args.b, args.b_slots) for spec in specs] + \
            [(m.key, "--kv-e8kv", m.spec, m.b, m.b_slots) for m in memory]
    for what, which, spec, port, slots in pulls:
        name = f"kl-{len(files)}.bin"
        with open(f"{slots}/prompt.json", "w") as f:
            json.dump({"tokens": prefix}, f)
        tool(args, "pull", "--model", args.model, "--store", args.unix, which, spec,
             "--chunk", str(args.chunk), "--tokens-file", f"{slots}/prompt.json", f"{slots}/{name}")
        files[what] = (port, name)

    def dist(answer):
        return {i: p for i, _, p in first_token_probs(answer)}

    ref = []
    for sfx in suffixes:
        post(args.b, "/slots/0?action=erase", {})
        ref.append(dist(post(args.b, "/completion", {"prompt": prefix + sfx, **ask})))
    listed = statistics.mean(sum(p.values()) for p in ref)
    out = {}
    for what, (port, name) in files.items():
        kls = []
        for sfx, p in zip(suffixes, ref):
            post(port, "/slots/0?action=erase", {})
            got = post(port, "/slots/0?action=restore", {"filename": name})
            if got["n_restored"] != len(prefix):
                sys.exit(f"[ttft] FAIL: {what}: B restored {got['n_restored']} of {len(prefix)} tokens")
            q = dist(post(port, "/completion", {"prompt": prefix + sfx, **ask}))
            q_floor = min(q.values())  # a token q did not list has at most q's smallest listed probability
            k = sum(pv * math.log(pv / max(q.get(t, q_floor), 1e-12)) for t, pv in p.items() if pv > 0)
            p_rest, q_rest = max(1 - sum(p.values()), 1e-12), max(1 - sum(q.get(t, 0) for t in p), 1e-12)
            kls.append(k + p_rest * math.log(p_rest / q_rest))
        out[what] = f"{statistics.mean(kls):.2e}"
        print(f"[ttft] KL {what}: {out[what]} over {len(kls)} next tokens (top-{n} listed mass {listed:.3f})",
              flush=True)
    return out


if __name__ == "__main__":
    main()
