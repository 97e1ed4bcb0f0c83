#!/usr/bin/env python3
"""Load and fault driver for ONE running llama-server (bench/server_load.sh starts the servers).

It builds a deterministic workload (seeded) from text corpora tokenized by the server itself, then,
depending on --mode:

  reference  every unit marked for reference is served alone: all slots erased, then the unit's
             requests one after the other (a chat's turns in order, so the prompt cache is reused
             as it would be by a lone client). Answers go to --ref FILE (JSON).
  load       1. solo phase: a single client; a plain request and a chat whose slot is saved, erased,
                overwritten and restored between its turns (the file is kept for the restart mode).
                Answers must equal the reference exactly (asserted).
             2. load phase: a pool of --clients streams (default 8) against the server's slots:
                single prompts from 16 tokens to a few thousand (longer than -b, so the server
                splits them over several llama_decode calls), multi-turn chats reusing their cached
                prefix, clients that disconnect mid-generation and mid-prefill (the prompt is then
                sent again), prompts longer than a slot (must be refused with a readable error),
                a chat that runs into the end of its slot (long form), and the save / erase /
                restore of slot 0 while the other slots keep decoding. The phase is cut in two
                parts; after each the pool drains, every slot is erased and the server's RSS is
                read (/proc/PID/status VmRSS): the leak check compares them (long form only).
             3. /health and the process must still be alive.
             Prints a JSON summary (also --summary FILE) and a human table; exit status 1 with the
             reasons when a check fails.
  restart    on a freshly started server: restores the slot file saved by the solo phase, sends the
             chat's next turn and requires the uninterrupted conversation's answer (reference).
  wall       a lone conversation run into the end of its slot --reps times (a ~6,000-token turn,
             a turn reusing it whose prompt + n_predict passes the slot, a turn longer than the
             slot); the same answers each time, slots erased and RSS read after each repetition.

Every request has a timeout; the whole run has a deadline. Greedy sampling (temperature 0, fixed
seed), cache_prompt on, prompts sent as token ids, answers compared as token ids. Standard library
only, loopback only.

  bench/server_load.py --port P --mode reference --ref ref.json [--short | --requests N]
  bench/server_load.py --port P --mode load --ref ref.json --pid PID [--short | --requests N]
  bench/server_load.py --port P --mode restart --ref ref.json [--short | --requests N]
  bench/server_load.py --port P --mode wall --ref /dev/null --pid PID [--reps 3]
  (the same workload options in the first three modes; --corpus-cache FILE keeps the tokenized text.)
"""
import argparse
import concurrent.futures
import json
import math
import os
import statistics
import sys
import threading
import time

# the client side and the workload live in modules beside this script (bench/server_load.sh runs
# it as a script, which puts its directory on sys.path; not so under python3 -P or PYTHONSAFEPATH)
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from server_load_client import (Client, Reservation, cpu_share_of_others, cpu_snapshot,  # noqa: E402
                                read_prompt_cache_kb, read_rss_kb)
from server_load_workload import bind_regions, build_workload, corpus_need, load_corpus, new_text  # noqa: E402

SOLO_SLOT = 0          # slot used by the solo and controlled save/restore scenarios
RESTART_FILE = "server_load_restart.bin"
CTL_FILE = "server_load_ctl.bin"


# ----------------------------------------------------------------------------------------------
# Comparison helpers


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(math.ceil(q / 100.0 * len(v))) - 1))]


# ----------------------------------------------------------------------------------------------
# Modes


class Run:
    def __init__(self, a):
        self.a = a
        self.cli = Client(a.port, a.timeout)
        self.deadline = time.monotonic() + a.deadline
        self.failures = []
        self.rss_trend = []   # (requests done, VmRSS kB) every 50 requests, slots not erased
        status, js, raw = self.cli.json_call("GET", "/slots")
        if status != 200 or not isinstance(js, list):
            raise SystemExit(f"GET /slots answered HTTP {status}: {raw[:200]}")
        self.n_slots = len(js)
        self.n_ctx = int(js[0]["n_ctx"])
        self.solo, self.units = build_workload(a.short, a.requests, a.seed, self.n_ctx, a.ref_fraction)
        self.corpus = load_corpus(self.cli, a.text, corpus_need(self.solo, self.units), a.corpus_cache)
        self.fillers = bind_regions(self.solo, self.units, self.corpus)
        self.ref = None
        if a.mode not in ("reference", "wall"):
            with open(a.ref) as f:
                self.ref = json.load(f)
            if a.mode != "wall" and self.ref.get("workload") != self.workload_key():
                raise SystemExit("the reference was made for another workload (options or corpus differ)")

    def workload_key(self):
        return {"short": self.a.short, "requests": self.a.requests, "seed": self.a.seed, "n_ctx": self.n_ctx,
                "n_slots": self.n_slots, "units": len(self.units),
                "corpus_head": self.corpus[:16], "corpus_len": len(self.corpus)}

    def fail(self, msg):
        print(f"[server-load] FAIL: {msg}", file=sys.stderr, flush=True)
        self.failures.append(msg)

    def check_deadline(self):
        if time.monotonic() > self.deadline:
            raise TimeoutError(f"the run passed its deadline of {self.a.deadline} s")

    # A chat's turns in order. answers: the previous turns' answers of THIS run.
    def prompt_for(self, unit, k, answers):
        p = []
        for j in range(k + 1):
            p += new_text(self.corpus, unit["turns"][j])
            if j < k:
                p += answers[j]
        return p

    # -- reference ------------------------------------------------------------------------------
    def reference(self):
        out = {"workload": self.workload_key(), "units": {}}
        t0 = time.monotonic()
        for u in self.solo + self.units:
            if not u["ref"]:
                continue
            self.check_deadline()
            self.cli.erase_all(self.n_slots)
            answers, recs = [], []
            for k, t in enumerate(u["turns"]):
                r = self.cli.complete(self.prompt_for(u, k, answers), t["n_predict"])
                if r["outcome"] != "ok":
                    self.fail(f"reference {u['id']} turn {k}: {r.get('kind')} {r.get('message', '')}")
                    break
                answers.append(r["tokens"])
                recs.append({"tokens": r["tokens"], "cache_n": r.get("cache_n"), "n_prompt": r["n_prompt"],
                             "truncated": r.get("truncated")})
            out["units"][u["id"]] = recs
        self.cli.erase_all(self.n_slots)
        with open(self.a.ref, "w") as f:
            json.dump(out, f)
        n = sum(len(v) for v in out["units"].values())
        print(f"[server-load] reference: {n} answers of {len(out['units'])} units in {time.monotonic() - t0:.0f} s")
        return 1 if self.failures else 0

    def ref_turn(self, u, k):
        recs = self.ref["units"].get(u["id"])
        if recs is None or k >= len(recs):
            return None
        return recs[k]

    # -- solo phase -----------------------------------------------------------------------------
    def solo_phase(self, results):
        cli = self.cli
        for u in self.solo:
            cli.erase_all(self.n_slots)
            answers = []
            for k, t in enumerate(u["turns"]):
                if u["kind"] == "solo_chat" and k == 1:
                    expect_n = len(self.prompt_for(u, 0, answers)) + len(answers[0]) - 1
                    saved = cli.slot_action(SOLO_SLOT, "save", RESTART_FILE)
                    if saved.get("n_saved") != expect_n:
                        self.fail(f"solo save: n_saved {saved.get('n_saved')}, expected {expect_n}")
                    self.erase_overwrite_restore(cli, self.fillers[0], RESTART_FILE, saved, "solo")
                r = cli.complete(self.prompt_for(u, k, answers), t["n_predict"], id_slot=SOLO_SLOT)
                rec = {"unit": u["id"], "ukind": u["kind"], "turn": k, "phase": "solo", **r}
                results.append(rec)
                if r["outcome"] != "ok":
                    self.fail(f"solo {u['id']} turn {k}: {r.get('kind')} {r.get('message', '')}")
                    break
                answers.append(r["tokens"])
                ref = self.ref_turn(u, k)
                d = first_diff(r["tokens"], ref["tokens"]) if ref else "no reference"
                rec["category"] = "solo-after-restore" if k == 1 and u["kind"] == "solo_chat" else "solo"
                rec["identical"] = d is None
                rec["first_diff"] = d
                if d is not None:
                    self.fail(f"solo {u['id']} turn {k} ({rec['category']}): answer differs from the reference "
                              f"at token {d}: {r['tokens'][:12]} vs {ref['tokens'][:12] if ref else None}")
                if k == 1 and u["kind"] == "solo_chat" and r.get("cache_n") != expect_n:
                    self.fail(f"solo turn after restore reused {r.get('cache_n')} cached tokens, expected {expect_n}")
        cli.erase_all(self.n_slots)

    # -- load phase -----------------------------------------------------------------------------
    def run_unit(self, u, worker, results, lock, reserve):
        """One unit by one client (its requests pinned to slots 1.. while the controlled scenario owns slot 0)."""
        cli = self.cli
        answers, diverged = [], False
        for k, t in enumerate(u["turns"]):
            self.check_deadline()
            prompt = self.prompt_for(u, k, answers)
            kw = {}
            if u["kind"] == "cancel_gen":
                kw["cancel_after_tokens"] = u["cancel_after_tokens"]
            if u["kind"] == "cancel_prefill":
                kw["cancel_in_prefill"] = True
            r = self.pinned(reserve, worker, prompt, t["n_predict"], **kw)
            rec = {"unit": u["id"], "ukind": u["kind"], "turn": k, "phase": "load", "worker": worker,
                   "expect": t["expect"], **r}
            if u["kind"] == "cancel_prefill":
                rec["ukind"] = "cancelled_prefill"
                with lock:
                    results.append(rec)
                # the same prompt again, to the end: the server may reuse what the cancelled one computed
                r = self.pinned(reserve, worker, prompt, t["n_predict"])
                rec = {"unit": u["id"], "ukind": "resume_after_cancel", "turn": k, "phase": "load",
                       "worker": worker, "expect": "ok", **r}
            self.judge(u, k, rec, diverged)
            with lock:
                results.append(rec)
                n_load = sum(1 for x in results if x["phase"] == "load")
                if self.a.pid and n_load % 50 == 0:
                    self.rss_trend.append((n_load, read_rss_kb(self.a.pid)))
            if r["outcome"] != "ok":
                break
            if rec.get("identical") is False or rec.get("category") == "chat-diverged":
                diverged = True
            answers.append(r["tokens"])

    def pinned(self, reserve, worker, prompt, n_predict, **kw):
        slot = reserve.begin(worker)
        try:
            r = self.cli.complete(prompt, n_predict, id_slot=slot, **kw)
        finally:
            reserve.end(slot)
        r["pinned_slot"] = slot
        return r

    def judge(self, u, k, rec, diverged):
        """Outcome expectation and comparison with the reference."""
        exp, oc = rec["expect"], rec["outcome"]
        if rec["ukind"] == "cancel_gen":
            if oc not in ("cancelled", "ok"):
                rec["unexpected"] = True
            return
        if rec["ukind"] == "cancelled_prefill":
            return
        if exp == "exceed":
            rec["unexpected"] = not (oc == "error" and "exceed_context" in rec.get("kind", "") and rec.get("readable", True))
            return
        if exp == "wall":
            # a prompt that fits with a prompt + n_predict that does not: a truncated answer, or a readable error
            ok = (oc == "ok" and rec.get("truncated")) or (oc == "error" and rec.get("readable", True) and rec.get("message"))
            rec["unexpected"] = not ok
            return
        if oc != "ok":
            rec["unexpected"] = True
            return
        if rec.get("truncated"):
            rec["unexpected"] = True
            rec["message"] = "truncated answer where the prompt fits"
        ref = self.ref_turn(u, k) if u["ref"] else None
        if ref is None:
            return
        if k > 0:
            if diverged:
                rec["category"] = "chat-diverged"
                return
            rec["category"] = "chat-reused" if (rec.get("cache_n") or 0) >= rec.get("n_prompt", 0) - u["turns"][k]["new"] - 1 \
                else "chat-recomputed"
        elif rec["ukind"] == "resume_after_cancel":
            rec["category"] = "resume-after-cancel"
        else:
            rec["category"] = "single-long" if rec["n_prompt"] > 2048 else "single"
        d = first_diff(rec["tokens"], ref["tokens"])
        rec["identical"] = d is None
        rec["first_diff"] = d
        rec["ref_tokens"] = ref["tokens"]

    def ctl_scenario(self, u, results, lock, reserve):
        """Slot 0 saved, erased, overwritten and restored while the other slots decode (the other
        clients are pinned to slots 1.. while this runs). Turn 2 is served twice on slot 0: right
        after turn 1 (uninterrupted) and after the restore; both are compared with each other and,
        when turn 1 matched it, with the reference."""
        cli = self.cli
        reserve.acquire_exclusive(self.a.timeout * 2)
        try:
            def serve(k, answers, tag):
                r = cli.complete(self.prompt_for(u, k, answers), u["turns"][k]["n_predict"], id_slot=SOLO_SLOT)
                rec = {"unit": u["id"], "ukind": u["kind"], "turn": k, "phase": "load", "worker": "ctl",
                       "expect": "ok", "ctl": tag, **r}
                if r["outcome"] != "ok":
                    rec["unexpected"] = True
                return rec

            r1 = serve(0, [], "turn1")
            recs = [r1]
            if r1["outcome"] == "ok":
                a1 = r1["tokens"]
                ref1, ref2 = self.ref_turn(u, 0), self.ref_turn(u, 1)
                self.compare(r1, ref1, "ctl-turn1")
                expect_n = len(self.prompt_for(u, 0, [])) + len(a1) - 1
                saved = cli.slot_action(SOLO_SLOT, "save", CTL_FILE)
                if saved.get("n_saved") != expect_n:
                    self.fail(f"load save of slot 0: n_saved {saved.get('n_saved')}, expected {expect_n}")
                r2u = serve(1, [a1], "turn2-uninterrupted")
                recs.append(r2u)
                self.erase_overwrite_restore(cli, self.fillers[1], CTL_FILE, saved, "load")
                r2r = serve(1, [a1], "turn2-after-restore")
                recs.append(r2r)
                if r2r["outcome"] == "ok" and r2r.get("cache_n") != expect_n:
                    self.fail(f"turn after the restore under load reused {r2r.get('cache_n')} cached tokens, expected {expect_n}")
                matched = ref1 is not None and a1 == ref1["tokens"]
                for rec in (r2u, r2r):
                    if rec["outcome"] != "ok":
                        continue
                    if matched:
                        self.compare(rec, ref2, "ctl-" + rec["ctl"])
                    else:
                        rec["category"] = "chat-diverged"
                if r2u["outcome"] == "ok" and r2r["outcome"] == "ok":
                    d = first_diff(r2r["tokens"], r2u["tokens"])
                    r2r["restore_vs_uninterrupted"] = d
            with lock:
                results.extend(recs)
        finally:
            reserve.release_exclusive()

    def erase_overwrite_restore(self, cli, filler_text, slot_file, saved, label):
        """Slot 0, saved to slot_file, is erased, overwritten by an unrelated prompt and restored;
        the restore must bring back as many tokens as the save wrote."""
        cli.slot_action(SOLO_SLOT, "erase")
        filler = cli.complete(filler_text, 8, id_slot=SOLO_SLOT)
        if filler["outcome"] != "ok":
            self.fail(f"{label} filler request: {filler.get('kind')} {filler.get('message', '')}")
        restored = cli.slot_action(SOLO_SLOT, "restore", slot_file)
        if restored.get("n_restored") != saved.get("n_saved"):
            self.fail(f"{label} restore: n_restored {restored.get('n_restored')} != n_saved {saved.get('n_saved')}")

    @staticmethod
    def compare(rec, ref, category):
        if ref is None:
            return
        d = first_diff(rec["tokens"], ref["tokens"])
        rec["category"] = category
        rec["identical"] = d is None
        rec["first_diff"] = d
        rec["ref_tokens"] = ref["tokens"]

    def load(self):
        a = self.a
        results, lock = [], threading.Lock()
        rss = {}
        t_start = time.monotonic()
        self.solo_phase(results)
        # cut the load in two parts at ~50 requests (long form) for the leak check
        n_first = 50 if not a.short else max(1, a.requests // 2)
        part_a, part_b, n = [], [], 0
        for u in self.units:
            (part_a if n < n_first else part_b).append(u)
            n += len(u["turns"]) + (1 if u["kind"] == "cancel_prefill" else 0)
        reserve = Reservation(self.n_slots)
        t_load = time.monotonic()

        def pool(units):
            it = iter(units)
            it_lock = threading.Lock()

            def worker(w):
                while True:
                    with it_lock:
                        u = next(it, None)
                    if u is None:
                        return
                    try:
                        if u["kind"] == "ctl_chat":
                            self.ctl_scenario(u, results, lock, reserve)
                        else:
                            self.run_unit(u, w, results, lock, reserve)
                    except TimeoutError as e:
                        self.fail(str(e))
                        return
                    except Exception as e:  # noqa: BLE001 - every failure is reported
                        self.fail(f"{u['id']} ({u['kind']}): {type(e).__name__}: {e}")

            with concurrent.futures.ThreadPoolExecutor(a.clients) as ex:
                list(ex.map(worker, range(a.clients)))

        def quiesce(label):
            self.cli.erase_all(self.n_slots)
            time.sleep(2.0)
            rss[label] = read_rss_kb(a.pid) if a.pid else None
            rss[label + "_prompt_cache"] = read_prompt_cache_kb(a.server_log)
            rss[label + "_requests"] = sum(1 for r in results if r["phase"] == "load")

        cpu0, load0 = cpu_snapshot(a.pid), os.getloadavg()
        pool(part_a)
        quiesce("first")
        pool(part_b)
        t_end_load = time.monotonic()
        cpu1, load1 = cpu_snapshot(a.pid), os.getloadavg()
        quiesce("last")
        # still alive and serving?
        alive = True
        if a.pid:
            try:
                os.kill(a.pid, 0)
            except OSError:
                alive = False
        try:
            hs, hj, _ = self.cli.json_call("GET", "/health", timeout=30)
        except OSError as e:
            hs, hj = None, str(e)
        if not alive or hs != 200:
            self.fail(f"server not alive or not healthy at the end (process alive {alive}, /health {hs} {hj})")
        summary = self.summarize(results, rss, t_load, t_end_load, t_start)
        summary["health_ok"] = hs == 200 and alive
        summary["rss_trend_kb"] = self.rss_trend
        summary["cpu_share_of_other_processes"] = cpu_share_of_others(cpu0, cpu1)
        summary["server_cpu_s"] = (cpu1[1] - cpu0[1]) / os.sysconf("SC_CLK_TCK")
        summary["loadavg_start_end"] = [load0[0], load1[0]]
        summary["failures"] = self.failures
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump(summary, f, indent=1)
        if a.results:
            with open(a.results, "w") as f:
                for r in results:
                    f.write(json.dumps(r) + "\n")
        print(json.dumps({k: v for k, v in summary.items() if k != "diffs"}, indent=1))
        self.print_table(summary)
        return 1 if self.failures else 0

    def summarize(self, results, rss, t_load, t_end_load, t_start):
        load = [r for r in results if r["phase"] == "load"]
        by_kind = {}
        for r in load:
            key = "ok" if r["outcome"] == "ok" else ("cancelled" if r["outcome"] == "cancelled" else r.get("kind", r["outcome"]))
            if r["outcome"] == "ok" and r.get("truncated"):
                key = "ok (truncated at the slot's end)"
            by_kind[key] = by_kind.get(key, 0) + 1
        unexpected = [r for r in load if r.get("unexpected")]
        for r in unexpected:
            self.fail(f"unexpected outcome for {r['unit']} turn {r['turn']} ({r['ukind']}, expected {r['expect']}): "
                      f"{r['outcome']} {r.get('kind', '')} {r.get('message', '')}"[:400])
        expected_errors = sum(1 for r in load if r["outcome"] == "error" and not r.get("unexpected"))
        ok = [r for r in load if r["outcome"] == "ok"]
        ttft = [r["ttft_s"] * 1000 for r in ok if r.get("ttft_s") is not None]
        tps = [r["predicted_per_second"] for r in ok if r.get("predicted_per_second") and (r.get("predicted_n") or 0) >= 4]
        gen_tokens = sum(len(r["tokens"]) for r in ok)
        prompt_tokens = sum(r.get("prompt_n") or 0 for r in ok)
        cats = {}
        diffs = []
        for r in results:
            c = r.get("category")
            if c is None:
                continue
            e = cats.setdefault(c, {"compared": 0, "identical": 0, "first_diff": []})
            if c == "chat-diverged":
                continue
            e["compared"] += 1
            if r.get("identical"):
                e["identical"] += 1
            else:
                e["first_diff"].append(r.get("first_diff"))
                diffs.append({"unit": r["unit"], "turn": r["turn"], "category": c, "n_prompt": r["n_prompt"],
                              "cache_n": r.get("cache_n"), "first_diff": r.get("first_diff"),
                              "got": r["tokens"][:24], "ref": (r.get("ref_tokens") or [])[:24]})
        compared = [r for r in load if r.get("category") and r["category"] != "chat-diverged"]
        identical = sum(1 for r in compared if r.get("identical"))
        rss_first, rss_last = rss.get("first"), rss.get("last")
        growth = (rss_last - rss_first) / rss_first * 100 if rss_first and rss_last else None
        # The leak check: RSS less llama-server's host prompt cache, which fills up to --cache-ram
        # by design (the same MiB whatever the KV cache type; without a readable log, none is
        # subtracted and the check is stricter).
        cache_first, cache_last = rss.get("first_prompt_cache") or 0, rss.get("last_prompt_cache") or 0
        own_first = rss_first - cache_first if rss_first else None
        own_last = rss_last - cache_last if rss_last else None
        own_growth = (own_last - own_first) / own_first * 100 if own_first and own_last else None
        if not self.a.short and self.a.pid:
            if own_growth is None:
                self.fail("RSS could not be read")
            elif own_growth > 5.0:
                self.fail(f"RSS less the prompt cache grew {own_growth:.1f} % from after the first "
                          f"{rss.get('first_requests')} requests ({own_first / 1024:.0f} MiB) to the end "
                          f"({own_last / 1024:.0f} MiB): over 5 %")
        ctl = [r for r in results if r.get("ctl") == "turn2-after-restore" and "restore_vs_uninterrupted" in r]
        return {
            "restore_vs_uninterrupted_under_load": [r["restore_vs_uninterrupted"] for r in ctl],
            "requests": len(load), "answered_ok": len(ok), "expected_errors": expected_errors,
            "unexpected": len(unexpected), "outcomes": by_kind,
            "ttft_ms_p50": pct(ttft, 50), "ttft_ms_p99": pct(ttft, 99),
            "tps_stream_p50": statistics.median(tps) if tps else None, "tps_stream_p10": pct(tps, 10),
            "load_wall_s": t_end_load - t_load, "total_wall_s": time.monotonic() - t_start,
            "generated_tokens": gen_tokens, "prompt_tokens_processed": prompt_tokens,
            "rss_first_kb": rss_first, "rss_first_after_requests": rss.get("first_requests"),
            "rss_last_kb": rss_last, "rss_last_after_requests": rss.get("last_requests"),
            "rss_growth_pct": growth,
            "prompt_cache_first_kb": rss.get("first_prompt_cache"), "prompt_cache_last_kb": rss.get("last_prompt_cache"),
            "rss_less_prompt_cache_growth_pct": own_growth,
            "identical_under_load": {"compared": len(compared), "identical": identical},
            "categories": {c: {"compared": e["compared"], "identical": e["identical"],
                               "first_diff_min": min([d for d in e["first_diff"] if d is not None], default=None),
                               "first_diff_median": statistics.median([d for d in e["first_diff"] if d is not None])
                               if [d for d in e["first_diff"] if d is not None] else None}
                           for c, e in cats.items()},
            "chat_turns_not_comparable": sum(1 for r in results if r.get("category") == "chat-diverged"),
            "diffs": diffs,
        }

    def print_table(self, s):
        f = lambda v, fmt="{:.0f}": "-" if v is None else fmt.format(v)
        print(f"\nrequests {s['requests']} (ok {s['answered_ok']}, expected errors {s['expected_errors']}, "
              f"unexpected {s['unexpected']}); outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(s["outcomes"].items())))
        print(f"TTFT p50 {f(s['ttft_ms_p50'])} ms, p99 {f(s['ttft_ms_p99'])} ms; decode per stream p50 "
              f"{f(s['tps_stream_p50'], '{:.1f}')} t/s (p10 {f(s['tps_stream_p10'], '{:.1f}')}); load phase "
              f"{s['load_wall_s']:.0f} s, {s['prompt_tokens_processed']} prompt tokens processed, "
              f"{s['generated_tokens']} generated")
        print(f"other processes used {f(s.get('cpu_share_of_other_processes'), '{:.0%}')} of the machine's CPU "
              f"during the load phase (load average {s['loadavg_start_end'][0]:.1f} -> {s['loadavg_start_end'][1]:.1f})")
        if s.get("restore_vs_uninterrupted_under_load"):
            print(f"slot 0 restored under load, turn 2 vs the same turn served right after turn 1: first difference "
                  f"{s['restore_vs_uninterrupted_under_load']} (None: identical)")
        print(f"RSS after {s['rss_first_after_requests']} requests {f(s['rss_first_kb'] and s['rss_first_kb'] / 1024)} MiB, "
              f"after {s['rss_last_after_requests']} {f(s['rss_last_kb'] and s['rss_last_kb'] / 1024)} MiB "
              f"({f(s['rss_growth_pct'], '{:+.1f}')} %); the host prompt cache held "
              f"{f(s['prompt_cache_first_kb'] and s['prompt_cache_first_kb'] / 1024, '{:.1f}')} and "
              f"{f(s['prompt_cache_last_kb'] and s['prompt_cache_last_kb'] / 1024, '{:.1f}')} MiB of them; RSS less "
              f"the prompt cache {f(s['rss_less_prompt_cache_growth_pct'], '{:+.1f}')} % "
              f"({'not checked in the short form' if self.a.short else 'checked: <= 5 %'})")
        print("| answers compared with the reference | compared | identical | first differing token (min / median) |")
        print("|---|---|---|---|")
        for c, e in sorted(s["categories"].items()):
            print(f"| {c} | {e['compared']} | {e['identical']} | {f(e['first_diff_min'])} / {f(e['first_diff_median'], '{}')} |")
        for msg in self.failures:
            print(f"FAIL: {msg}")

    # -- wall -----------------------------------------------------------------------------------
    def wall(self):
        """A lone conversation run into the end of its slot, --reps times on one server: a
        ~6,000-token first turn, a second turn that reuses it and whose prompt + n_predict passes
        the slot's context (truncated answer or readable error), a third turn longer than the slot
        (refused); every slot erased after each repetition and the RSS read. The same answers every
        time are required (a lone client: exactly reproducible), and RSS must not keep growing."""
        n1 = min(6000, self.n_ctx - 1200)
        start = len(self.corpus) - 20_000 + 10
        cur = start
        turns = []
        for new, n_predict, expect in ((n1, 16, "ok"), (self.n_ctx - n1 - 16 - 24, 64, "wall"), (300, 16, "exceed")):
            turns.append({"start": cur, "new": new, "n_predict": n_predict, "expect": expect})
            cur += new + 7
        u = {"id": "wall", "kind": "wall_chat", "turns": turns, "ref": False}
        reps, rss, caches = [], [], []
        for rep in range(self.a.reps):
            self.check_deadline()
            self.cli.erase_all(self.n_slots)
            answers, recs = [], []
            for k, t in enumerate(turns):
                r = self.cli.complete(self.prompt_for(u, k, answers), t["n_predict"], id_slot=SOLO_SLOT)
                rec = {"ukind": "wall_chat", "turn": k, "expect": t["expect"], **r}
                self.judge(u, k, rec, False)
                if rec.get("unexpected"):
                    self.fail(f"wall rep {rep} turn {k} (expected {t['expect']}): {r['outcome']} "
                              f"{r.get('kind', '')} {r.get('message', '')} truncated={r.get('truncated')}")
                recs.append({k2: rec.get(k2) for k2 in ("turn", "outcome", "kind", "message", "n_prompt", "cache_n",
                                                         "prompt_n", "truncated", "stop_type", "tokens", "wall_s")})
                if r["outcome"] != "ok":
                    break
                answers.append(r["tokens"])
            self.cli.erase_all(self.n_slots)
            time.sleep(2.0)
            rss.append(read_rss_kb(self.a.pid) if self.a.pid else None)
            caches.append(read_prompt_cache_kb(self.a.server_log) or 0)
            reps.append(recs)
            print(f"[server-load] wall rep {rep}: " + "; ".join(
                f"turn {x['turn']} {x['outcome']} {x.get('kind') or ''} prompt {x['n_prompt']} cached {x.get('cache_n')} "
                f"truncated {x.get('truncated')} {len(x.get('tokens') or [])} tokens" for x in recs) +
                f"; RSS {rss[-1] and rss[-1] // 1024} MiB (prompt cache {caches[-1] / 1024:.1f} MiB)", flush=True)
        for rep in range(1, len(reps)):
            a0 = [x.get("tokens") for x in reps[0]]
            ai = [x.get("tokens") for x in reps[rep]]
            if a0 != ai:
                self.fail(f"wall rep {rep}: answers differ from rep 0 (a lone client must be reproducible)")
        own = [x - c for x, c in zip(rss, caches)] if all(rss) else []
        if len(own) >= 3 and own[-1] - own[1] > 0.02 * rss[1]:
            self.fail(f"wall: RSS less the prompt cache kept growing after the first repetition: "
                      f"{[x // 1024 for x in own]} MiB")
        res = {"reps": reps, "rss_kb": rss, "prompt_cache_kb": caches, "failures": self.failures}
        if self.a.summary:
            with open(self.a.summary, "w") as f:
                json.dump(res, f, indent=1)
        return 1 if self.failures else 0

    # -- restart --------------------------------------------------------------------------------
    def restart(self):
        u = self.solo[1]
        ref0, ref1 = self.ref_turn(u, 0), self.ref_turn(u, 1)
        expect_n = len(self.prompt_for(u, 0, [])) + len(ref0["tokens"]) - 1
        restored = self.cli.slot_action(SOLO_SLOT, "restore", RESTART_FILE)
        if restored.get("n_restored") != expect_n:
            self.fail(f"restart restore: n_restored {restored.get('n_restored')}, expected {expect_n}")
        r = self.cli.complete(self.prompt_for(u, 1, [ref0["tokens"]]), u["turns"][1]["n_predict"], id_slot=SOLO_SLOT)
        res = {"restored_tokens": restored.get("n_restored"), "outcome": r["outcome"], "cache_n": r.get("cache_n")}
        if r["outcome"] != "ok":
            self.fail(f"restart: the turn after the restore failed: {r.get('kind')} {r.get('message', '')}")
        else:
            d = first_diff(r["tokens"], ref1["tokens"])
            res["identical"] = d is None
            res["first_diff"] = d
            if r.get("cache_n") != expect_n:
                self.fail(f"restart: the turn after the restore reused {r.get('cache_n')} cached tokens, expected {expect_n}")
            if d is not None:
                self.fail(f"restart: the answer after restoring on a new server differs from the uninterrupted "
                          f"conversation at token {d}: {r['tokens']} vs {ref1['tokens']}")
        res["failures"] = self.failures
        if self.a.summary:
            with open(self.a.summary, "w") as f:
                json.dump(res, f, indent=1)
        print(json.dumps(res))
        return 1 if self.failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--mode", choices=["reference", "load", "restart", "wall"], required=True)
    ap.add_argument("--reps", type=int, default=3, help="--mode wall: repetitions")
    ap.add_argument("--ref", required=True, help="reference answers (written by --mode reference)")
    ap.add_argument("--short", action="store_true", help="short form: 48 requests, prompts up to ~2,200 tokens")
    ap.add_argument("--requests", type=int, default=None, help="requests of the load phase (default 500; --short: 48)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seed", type=int, default=49)
    ap.add_argument("--ref-fraction", type=float, default=0.25,
                    help="long form: share of the ordinary units also served alone for the reference")
    ap.add_argument("--text", action="append", default=None, help="corpus files (default: scripts/fetch-text.sh's)")
    ap.add_argument("--corpus-cache", default=None)
    ap.add_argument("--pid", type=int, default=None, help="llama-server's process id (RSS, liveness)")
    ap.add_argument("--server-log", default=None,
                    help="llama-server's log at -lv 4: the host prompt cache's size, subtracted from RSS by the leak check")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per socket operation of a request")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for the whole mode")
    ap.add_argument("--summary", default=None)
    ap.add_argument("--results", default=None, help="every request's record, JSON lines")
    a = ap.parse_args()
    if a.requests is None:
        a.requests = 48 if a.short else 500
    if a.deadline is None:
        a.deadline = 1200 if a.short else 5400
    if not a.text:
        home = os.path.expanduser("~/.cache/e8kv/text")
        a.text = [os.path.join(home, "tech.txt"), os.path.join(home, "fiction.txt")]
    run = Run(a)
    try:
        rc = {"reference": run.reference, "load": run.load, "restart": run.restart, "wall": run.wall}[a.mode]()
    except TimeoutError as e:
        print(f"[server-load] FAIL: {e}", file=sys.stderr)
        rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
