"""The client side of bench/server_load.py: requests to ONE running llama-server over HTTP
(streaming /completion with its time to first token, disconnects mid-prefill or mid-generation,
/slots save / erase / restore, /tokenize), the pinning of the client streams' requests to slots,
and what /proc says about the server's process (VmRSS, CPU time). Standard library only, loopback
only."""
import http.client
import json
import os
import re
import socket
import threading
import time

HOST = "127.0.0.1"
SEED = 1234            # sampling seed of every request (greedy anyway)


# ----------------------------------------------------------------------------------------------
# HTTP


class Client:
    def __init__(self, port, timeout):
        self.port = port
        self.timeout = timeout

    def json_call(self, method, path, body=None, timeout=None):
        """Returns (status, parsed JSON or None, raw text). Raises on transport failures."""
        conn = http.client.HTTPConnection(HOST, self.port, timeout=timeout or self.timeout)
        try:
            data = None if body is None else json.dumps(body)
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8", "replace")
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            return resp.status, parsed, raw
        finally:
            conn.close()

    def slot_action(self, slot, action, filename=None):
        body = {} if filename is None else {"filename": filename}
        status, js, raw = self.json_call("POST", f"/slots/{slot}?action={action}", body)
        if status != 200 or js is None:
            raise RuntimeError(f"slot {slot} {action} answered HTTP {status}: {raw[:300]}")
        return js

    def erase_all(self, n_slots):
        for s in range(n_slots):
            self.slot_action(s, "erase")

    def complete(self, prompt, n_predict, id_slot=None, cancel_after_tokens=None, cancel_in_prefill=False):
        """A streaming /completion. Returns a dict: outcome ok | error | cancelled | transport,
        tokens, ttft_s, wall_s, final chunk fields (cache_n, truncated, ...).
        cancel_after_tokens: disconnect after that many tokens; cancel_in_prefill: disconnect as soon
        as the server reports part of the prompt processed (prompt_progress), else after the first token."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "seed": SEED,
                "cache_prompt": True, "stream": True, "return_tokens": True}
        if id_slot is not None:
            body["id_slot"] = id_slot
        if cancel_in_prefill:
            body["return_progress"] = True
            cancel_after_tokens = cancel_after_tokens or 1
        out = {"outcome": None, "tokens": [], "ttft_s": None, "n_prompt": len(prompt), "n_predict": n_predict}
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection(HOST, self.port, timeout=self.timeout)
        try:
            conn.request("POST", "/completion", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raw = resp.read().decode("utf-8", "replace")
                out.update(self._error(resp.status, raw))
                return out
            while True:
                line = resp.readline()
                if not line:
                    out["outcome"] = "transport"
                    out["kind"] = "transport:stream ended without a final chunk"
                    return out
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                try:
                    chunk = json.loads(line[6:])
                except ValueError:
                    out["outcome"] = "error"
                    out["kind"] = "unreadable stream chunk"
                    out["message"] = line[:300].decode("utf-8", "replace")
                    return out
                if "error" in chunk:
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                    out["outcome"] = "error"
                    out["kind"] = "stream:" + str(err.get("type", "unknown"))
                    out["message"] = str(err.get("message", ""))
                    return out
                prog = chunk.get("prompt_progress")
                if prog:
                    out["progress"] = prog
                    done = prog.get("processed", 0)
                    if cancel_in_prefill and 0 < done and prog.get("cache", 0) + done < prog.get("total", 0):
                        out["outcome"] = "cancelled"
                        out["cancelled_in"] = "prefill"
                        self._drop(conn)
                        return out
                    continue
                toks = chunk.get("tokens") or []
                if toks and out["ttft_s"] is None:
                    out["ttft_s"] = time.perf_counter() - t0
                if not chunk.get("stop"):
                    out["tokens"].extend(toks)
                elif toks and len(toks) >= len(out["tokens"]) and toks[:len(out["tokens"])] == out["tokens"]:
                    out["tokens"] = list(toks)  # a final chunk that repeats the whole answer
                elif toks:
                    out["tokens"].extend(toks)
                if cancel_after_tokens is not None and len(out["tokens"]) >= cancel_after_tokens and not chunk.get("stop"):
                    out["outcome"] = "cancelled"
                    out["cancelled_in"] = "generation"
                    self._drop(conn)
                    return out
                if chunk.get("stop"):
                    t = chunk.get("timings") or {}
                    out["outcome"] = "ok"
                    out["cache_n"] = t.get("cache_n", chunk.get("tokens_cached"))
                    out["prompt_n"] = t.get("prompt_n")
                    out["prompt_ms"] = t.get("prompt_ms")
                    out["predicted_n"] = t.get("predicted_n", chunk.get("tokens_predicted"))
                    out["predicted_per_second"] = t.get("predicted_per_second")
                    out["truncated"] = bool(chunk.get("truncated"))
                    out["stop_type"] = chunk.get("stop_type")
                    out["id_slot"] = chunk.get("id_slot")
                    return out
        except (OSError, http.client.HTTPException) as e:
            out["outcome"] = "transport"
            out["kind"] = f"transport:{type(e).__name__}"
            out["message"] = str(e)
            return out
        finally:
            out["wall_s"] = time.perf_counter() - t0
            conn.close()

    @staticmethod
    def _drop(conn):
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()

    @staticmethod
    def _error(status, raw):
        try:
            js = json.loads(raw)
        except ValueError:
            return {"outcome": "error", "kind": f"http{status}:unreadable", "message": raw[:300], "readable": False}
        err = js.get("error", js) if isinstance(js, dict) else {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        msg = str(err.get("message", ""))
        return {"outcome": "error", "kind": f"http{status}:{err.get('type', 'unknown')}", "message": msg,
                "readable": bool(msg)}


# ----------------------------------------------------------------------------------------------
# Slots shared by the client streams


class Reservation:
    """While the controlled scenario owns slot 0, new requests of the other clients are pinned to
    slots 1..n-1; the scenario starts once no unpinned request is in flight (the server could
    otherwise hand slot 0 to one of them between the scenario's requests)."""

    def __init__(self, n_slots):
        self.n_slots = n_slots
        self.cv = threading.Condition()
        self.exclusive = False
        self.unpinned = 0

    def begin(self, worker):
        with self.cv:
            if self.exclusive:
                return 1 + worker % (self.n_slots - 1)
            self.unpinned += 1
            return None

    def end(self, slot):
        with self.cv:
            if slot is None:
                self.unpinned -= 1
                self.cv.notify_all()

    def acquire_exclusive(self, timeout):
        with self.cv:
            self.exclusive = True
            if not self.cv.wait_for(lambda: self.unpinned == 0, timeout):
                raise TimeoutError("the other clients' requests did not drain for the save/restore scenario")

    def release_exclusive(self):
        with self.cv:
            self.exclusive = False


# ----------------------------------------------------------------------------------------------
# The server's process and the machine (/proc)


def cpu_snapshot(pid):
    """(busy jiffies of the whole machine, jiffies of the server process, of this driver, time)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = sum(v) - v[3] - (v[4] if len(v) > 4 else 0)   # all but idle and iowait
    srv = 0
    if pid:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            srv = int(fields[11]) + int(fields[12])
        except OSError:
            pass
    t = os.times()
    return busy, srv, (t.user + t.system) * os.sysconf("SC_CLK_TCK"), time.monotonic()


def cpu_share_of_others(a, b):
    """Share of the machine's CPU time that neither the server nor this driver used between two
    snapshots (other processes competing for the cores: timings are then not clean)."""
    hz, ncpu = os.sysconf("SC_CLK_TCK"), os.cpu_count() or 1
    total = (b[3] - a[3]) * hz * ncpu
    others = (b[0] - a[0]) - (b[1] - a[1]) - (b[2] - a[2])
    return max(0.0, others / total) if total > 0 else None


def read_rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


PROMPT_CACHE_STATE = re.compile(r"cache state: (\d+) prompts, ([0-9.]+) MiB")


def read_prompt_cache_kb(log_path):
    """The size of llama-server's host prompt cache (--cache-ram) as its log last reported it, in
    kB; 0 before it first reports (nothing cached), None when the log cannot be read. The server
    writes the line at trace verbosity (-lv 4) after every change to the cache. The cache keeps idle
    slots' states up to its limit by design: a leak check must not count it as growth (it is the
    same 16 MiB for every cache type, 8 % of an e8kv server's RSS and 2 % of an f16 one's)."""
    if not log_path:
        return None
    try:
        with open(log_path, errors="replace") as f:
            found = PROMPT_CACHE_STATE.findall(f.read())
    except OSError:
        return None
    return int(float(found[-1][1]) * 1024) if found else 0
