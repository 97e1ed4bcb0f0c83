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
Stdlib only."""
import math
import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", type=int, required=True, help="server A's port")
    ap.add_argument("--b", type=int, required=True, help="server B's port")
    ap.add_argument("--b-slots", required=True, help="server B's --slot-save-path")
    ap.add_argument("--a-slots", required=True, help="server A's --slot-save-path")
    ap.add_argument("--unix", required=True)
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
    args = ap.parse_args()
    specs = [s for s in args.specs.split(";") if s]

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
        out = subprocess.run([args.tool, "push", "--model", args.model, "--store", args.unix, "--config", spec,
                              "--chunk", str(args.chunk), "--ttl", "3600", slot_path],
                             check=True, capture_output=True, text=True).stdout
        ms = (time.perf_counter() - t) * 1000
        value = int(out.split("-> value ")[1].split(" ")[0])
        pushed[spec] = value
        print(f"[ttft] push {spec}: {ms:.0f} ms: {out.strip()}", flush=True)

    methods = [("recompute", None)] + [(f"raw slot via {tr}", tr) for tr in ("unix", "tcp")] + \
              [(f"{spec} via {tr}", tr) for spec in specs for tr in ("unix", "tcp")]
    rows = {m: {"ttft": [], "fetch": [], "restore": [], "answer": [], "evaluated": [], "model": [], "top": None}
            for m, _ in methods}

    def erase_b():
        post(args.b, "/slots/0?action=erase", {})

    for rep in range(args.reps):
        for name, tr in methods:
            erase_b()
            row = rows[name]
            store = args.unix if tr == "unix" else args.tcp
            t0 = time.perf_counter()
            if name == "recompute":
                t1 = t2 = t0
            elif name.startswith("raw slot"):
                data = resp(store, "GET", "ttft:raw-slot")
                with open(f"{args.b_slots}/restored.bin", "wb") as f:
                    f.write(data)
                t1 = time.perf_counter()
                restored = post(args.b, "/slots/0?action=restore", {"filename": "restored.bin"})
                t2 = time.perf_counter()
                if restored["n_restored"] != len(prefix):
                    sys.exit(f"[ttft] FAIL: raw restore gave {restored['n_restored']} tokens")
            else:
                spec = name.split(" via ")[0]
                with open(f"{args.b_slots}/prompt.json", "w") as f:
                    json.dump({"tokens": prompt_b}, f)
                out = subprocess.run([args.tool, "pull", "--model", args.model, "--store", store, "--config", spec,
                                      "--chunk", str(args.chunk), "--tokens-file", f"{args.b_slots}/prompt.json",
                                      f"{args.b_slots}/restored.bin"], capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"[ttft] FAIL: pull {spec} exit {out.returncode}: {out.stdout}{out.stderr}")
                t1 = time.perf_counter()
                pulled = int(out.stdout.split("restored ")[1].split(" ")[0])
                row["model"].append(float(out.stdout.split("(model ")[1].split(" ms")[0]))
                restored = post(args.b, "/slots/0?action=restore", {"filename": "restored.bin"})
                t2 = time.perf_counter()
                if restored["n_restored"] != pulled or pulled != len(prefix):
                    sys.exit(f"[ttft] FAIL: pull wrote {pulled} tokens, B restored {restored['n_restored']}, "
                             f"prefix {len(prefix)}")
            ans = post(args.b, "/completion", {"prompt": prompt_b, **greedy})
            t3 = time.perf_counter()
            row["ttft"].append((t3 - t0) * 1000)
            row["fetch"].append((t1 - t0) * 1000)
            row["restore"].append((t2 - t1) * 1000)
            row["answer"].append((t3 - t2) * 1000)
            row["evaluated"].append(ans["timings"]["prompt_n"])
            row["top"] = top5(ans)
            print(f"[ttft] rep {rep + 1}/{args.reps} {name}: {(t3 - t0) * 1000:.0f} ms "
                  f"(B evaluated {ans['timings']['prompt_n']} tokens)", flush=True)

    kl = quality(args, prefix, tokens, specs, greedy)

    base = statistics.median(rows["recompute"]["ttft"])
    ref = rows["recompute"]["top"]
    print()
    print(f"| method | store | bytes fetched | TTFT ms | fetch ms | restore ms | B's answer ms (tokens evaluated) "
          f"| vs recompute | first token, p (recompute: {ref[0][0]!r} {ref[0][1]:.3f}) | KL |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    med = statistics.median
    for name, tr in methods:
        r = rows[name]
        what = name.split(" via ")[0]
        size = "-" if name == "recompute" else f"{len(raw):,}" if what == "raw slot" else f"{pushed[what]:,}"
        ttft = med(r["ttft"])
        first = r["top"][0] if r["top"] else ("?", 0)
        same = "same" if first[0] == ref[0][0] else "DIFFERENT"
        fetch = f"{med(r['fetch']):.0f}" + (f" (model load {med(r['model']):.0f})" if r["model"] else "")
        print(f"| {what} | {tr or '-'} | {size} | {ttft:.0f} ({min(r['ttft']):.0f}-{max(r['ttft']):.0f}) | "
              f"{fetch} | {med(r['restore']):.0f} | {med(r['answer']):.0f} ({int(med(r['evaluated']))}) | "
              f"{base / ttft:.2f}x | {same}, {first[1]:.3f} | {kl.get(what, '-')} |")


def quality(args, prefix, tokens, specs, greedy):
    """KL(recomputed || restored) of B's next token after each of --kl-suffixes suffixes."""
    n = 256
    suffixes = [tokens[args.prefix + (i + 2) * args.suffix: args.prefix + (i + 3) * args.suffix]
                for i in range(args.kl_suffixes)]
    ask = {**greedy, "n_probs": n}
    # Each method's slot file once (fetch time is measured above), restored before every suffix.
    files = {"raw slot": f"{args.a_slots}/slot.bin"}
    for spec in specs:
        path = f"{args.b_slots}/kl-{len(files)}.bin"
        with open(f"{args.b_slots}/prompt.json", "w") as f:
            json.dump({"tokens": prefix}, f)
        subprocess.run([args.tool, "pull", "--model", args.model, "--store", args.unix, "--config", spec,
                        "--chunk", str(args.chunk), "--tokens-file", f"{args.b_slots}/prompt.json", path],
                       check=True, capture_output=True)
        files[spec] = path

    def dist(answer):
        return {i: p for i, _, p in first_token_probs(answer)}

    ref = []
    for sfx in suffixes:
        post(args.b, "/slots/0?action=erase", {})
        ref.append(dist(post(args.b, "/completion", {"prompt": prefix + sfx, **ask})))
    listed = statistics.mean(sum(p.values()) for p in ref)
    out = {}
    for what, path in files.items():
        name = path.rsplit("/", 1)[1]
        if path.startswith(args.a_slots):  # the raw slot: copy it where B restores from
            with open(path, "rb") as src, open(f"{args.b_slots}/{name}", "wb") as dst:
                dst.write(src.read())
        kls = []
        for sfx, p in zip(suffixes, ref):
            post(args.b, "/slots/0?action=erase", {})
            got = post(args.b, "/slots/0?action=restore", {"filename": name})
            if got["n_restored"] != len(prefix):
                sys.exit(f"[ttft] FAIL: {what}: B restored {got['n_restored']} of {len(prefix)} tokens")
            q = dist(post(args.b, "/completion", {"prompt": prefix + sfx, **ask}))
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
