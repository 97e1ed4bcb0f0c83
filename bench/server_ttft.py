#!/usr/bin/env python3
"""Run by bench/server_ttft.sh against one llama-server: per repetition, the slot erased, a
PROMPT-token prompt (the server's own tokenizer, text from the corpora) with n_predict 1, then the
same prompt plus 256 more tokens with cache_prompt, n_predict 1. Prints the two medians (ms):
wall time of each /completion request, which is the time to first token at n_predict 1. Stdlib only."""
import argparse
import json
import statistics
import time
import urllib.request


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--text", action="append", required=True)
    ap.add_argument("--prompt", type=int, required=True)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in a.text)
    tokens = post(a.port, "/tokenize", {"content": text})["tokens"]
    need = a.prompt + 256
    if len(tokens) < need:
        raise SystemExit(f"the corpora hold {len(tokens)} tokens, {need} are needed")
    first, second = tokens[: a.prompt], tokens[: need]
    t1, t2 = [], []
    for rep in range(a.reps):
        post(a.port, "/slots/0?action=erase", {})
        start = time.perf_counter()
        r = post(a.port, "/completion", {"prompt": first, "n_predict": 1, "cache_prompt": True, "temperature": 0})
        t1.append(1000 * (time.perf_counter() - start))
        if r.get("tokens_evaluated", a.prompt) < a.prompt:
            raise SystemExit(f"the first turn evaluated {r.get('tokens_evaluated')} tokens")
        start = time.perf_counter()
        r = post(a.port, "/completion", {"prompt": second, "n_predict": 1, "cache_prompt": True, "temperature": 0})
        t2.append(1000 * (time.perf_counter() - start))
        cached = r.get("tokens_cached", r.get("timings", {}).get("cache_n"))
        processed = r.get("timings", {}).get("prompt_n")
        if processed is not None and processed > 300:
            raise SystemExit(f"the second turn processed {processed} tokens: the first turn's cache was not reused "
                             f"(tokens_cached {cached})")
    print(f"{statistics.median(t1):.0f} {statistics.median(t2):.0f}")


if __name__ == "__main__":
    main()
