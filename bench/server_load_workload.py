"""The workload of bench/server_load.py: text corpora tokenized by the server itself, and the
deterministic (seeded) units of requests built from them, every turn bound to its own slice of
the corpus. Standard library only."""
import json
import math
import os
import random


# ----------------------------------------------------------------------------------------------
# Corpus and workload


def load_corpus(cli, texts, need, cache):
    if cache and os.path.exists(cache):
        with open(cache) as f:
            toks = json.load(f)
        if len(toks) >= need:
            return toks
    toks = []
    piece = 100_000
    for path in texts:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for i in range(0, len(text), piece):
            status, js, raw = cli.json_call("POST", "/tokenize", {"content": text[i:i + piece]})
            if status != 200:
                raise SystemExit(f"/tokenize answered HTTP {status}: {raw[:200]}")
            toks.extend(js["tokens"])
            if len(toks) >= need:
                break
        if len(toks) >= need:
            break
    if len(toks) < need:
        raise SystemExit(f"the corpora hold {len(toks)} tokens, the workload needs {need}")
    if cache:
        with open(cache, "w") as f:
            json.dump(toks, f)
    return toks


def log_uniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def build_workload(short, n_requests, seed, n_ctx, ref_fraction):
    """Units (lists of turns) with token lengths only; corpus regions are bound afterwards.
    Turn: {"new": length of new text, "n_predict": N, "expect": ok | exceed | wall}."""
    rng = random.Random(seed)
    npred = lambda: rng.choice([8, 8, 16, 16] if short else [8, 8, 16, 16, 24, 32])

    def single_len():
        x = rng.random()
        if short:
            return log_uniform(rng, 16, 200) if x < 0.75 else log_uniform(rng, 200, 600)
        if x < 0.8:
            return log_uniform(rng, 16, 160)
        return log_uniform(rng, 160, 800) if x < 0.98 else log_uniform(rng, 800, 2000)

    def turn(new, n, expect="ok"):
        return {"new": new, "n_predict": n, "expect": expect}

    solo = [
        {"kind": "solo_single", "turns": [turn(200, 16)]},
        {"kind": "solo_chat", "turns": [turn(300, 16), turn(96, 16)]},   # saved/restored between turns
    ]
    special = [{"kind": "single", "turns": [turn(2200 if short else 2600, 16)]},  # > -b 2048: several decode calls
               {"kind": "ctl_chat", "turns": [turn(300, 16), turn(64, 16)]}]
    n_overflow, n_cancel_gen, n_cancel_prefill, n_chats = (2, 3, 1, 4) if short else (6, 15, 4, 40)
    for _ in range(n_overflow):
        special.append({"kind": "overflow", "turns": [turn(n_ctx + rng.choice([1, 64, 900]), 16, "exceed")]})
    for _ in range(n_cancel_gen):
        special.append({"kind": "cancel_gen", "turns": [turn(log_uniform(rng, 32, 400), 256)],
                        "cancel_after_tokens": rng.choice([1, 2, 4])})
    for _ in range(n_cancel_prefill):
        special.append({"kind": "cancel_prefill", "turns": [turn(rng.randint(800, 1600) if short else rng.randint(1200, 2400), 16)]})
    for _ in range(n_chats):
        nt = rng.choice([2, 3] if short else [2, 3, 4])
        turns = [turn(log_uniform(rng, 64, 400 if short else 600), npred())]
        turns += [turn(log_uniform(rng, 32, 160 if short else 200), npred()) for _ in range(nt - 1)]
        special.append({"kind": "chat", "turns": turns})
    if not short:
        special.append({"kind": "single", "turns": [turn(4000, 16)]})
        # a conversation that runs into the end of its slot: ~6,000 tokens, then a turn whose
        # prompt + n_predict passes the slot's context (truncated or refused), then one whose
        # prompt alone does (refused).
        special.append({"kind": "wall_chat", "turns": [turn(6000, 16), turn(n_ctx - 6000 - 16 - 24, 64, "wall"),
                                                        turn(300, 16, "exceed")]})
    count = lambda units: sum(len(u["turns"]) + (1 if u["kind"] == "cancel_prefill" else 0) for u in units)
    units = list(special)
    while count(units) < n_requests:
        units.append({"kind": "single", "turns": [turn(single_len(), npred())]})
    rng.shuffle(units)
    # the controlled save/restore in the middle of the second part, not first nor last
    ctl = next(u for u in units if u["kind"] == "ctl_chat")
    units.remove(ctl)
    units.insert(int(len(units) * 0.6), ctl)
    rref = random.Random(seed + 1)
    for i, u in enumerate(solo + units):
        u["id"] = f"u{i:04d}"
        if u["kind"] in ("solo_single", "solo_chat", "ctl_chat"):
            u["ref"] = True
        elif u["kind"] in ("overflow", "cancel_gen", "wall_chat"):
            u["ref"] = False   # nothing to compare (cancel_gen: partial answers)
        else:
            u["ref"] = short or rref.random() < ref_fraction
    return solo, units


def bind_regions(solo, units, corpus):
    """Gives every turn its own slice of the corpus; a unit's first token is unique across units
    so that no two units share a prompt prefix (the server would otherwise reuse a slot's cache
    for it, which is not what a fresh server does)."""
    used_first = set()
    cur = 0
    for u in solo + units:
        for k, t in enumerate(u["turns"]):
            if k == 0:
                while corpus[cur] in used_first:
                    cur += 1
                used_first.add(corpus[cur])
            t["start"] = cur
            cur += t["new"] + 7
            if cur > len(corpus):
                raise SystemExit("corpus too short for the workload")
    # fillers (solo/ctl scenarios overwrite slot 0 with an unrelated prompt)
    fillers = []
    for _ in range(4):
        while corpus[cur] in used_first:
            cur += 1
        used_first.add(corpus[cur])
        fillers.append(corpus[cur:cur + 48])
        cur += 55
    return fillers


def corpus_need(solo, units):
    return sum(t["new"] + 7 for u in solo + units for t in u["turns"]) + 20_000


def new_text(corpus, t):
    return corpus[t["start"]:t["start"] + t["new"]]
