"""e8kv.lmcache: the serde on its own (torch tensors standing in for LMCache's MemoryObjs: fixed
size, round-trip error, refusals, damaged values), and a chunk's round trip through LMCache's own
Redis L2 adapter wrapped by its SerdeL2AdapterWrapper, against a redis-server this test starts on
127.0.0.1 (no persistence). The LMCache tests need LMCache (scripts/lmcache-venv.sh; pinned 0.5.6)
and are reported as skipped without it, or without redis-server."""
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import e8kv  # noqa: E402
from e8kv import lmcache as e8lmc  # noqa: E402

L, T, HEADS, D = 3, 64, 2, 64  # layers, chunk tokens, kv heads, head_dim
SEED = 38


def chunk(seed=SEED, dtype=torch.bfloat16, tokens=T):
    """A KV chunk [2, L, tokens, HEADS * D] with post-RoPE-like keys (a per-channel offset)."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, L, tokens, HEADS * D, generator=g)
    kv[0] += torch.randn(HEADS * D, generator=g)
    return kv.to(dtype)


def obj(t):
    return types.SimpleNamespace(tensor=t)


def layout(t):
    return types.SimpleNamespace(shapes=[t.shape], dtypes=[t.dtype])


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


def serde(preset="quant-k3v2", **kw):
    return e8lmc.E8kvSerde(e8lmc.SerdeConfig(preset=preset, head_dim=D, **kw))


def round_trip(s, src):
    size = s.estimate_serialized_size(layout(src))
    buf = torch.full((size,), 0xAB, dtype=torch.uint8)
    assert s.serialize(obj(src), obj(buf), None) == size
    out = torch.zeros_like(src)
    s.deserialize(obj(buf), obj(out), None)
    return buf, out


@pytest.mark.parametrize("preset,bound", [("quant-k4v4", 0.12), ("quant-k3v2", 0.35)])
def test_round_trip_fixed_size_and_error(preset, bound):
    s = serde(preset)
    a, b = chunk(1), chunk(2)
    buf_a, out_a = round_trip(s, a)
    buf_b, out_b = round_trip(s, b)
    assert buf_a.numel() == buf_b.numel()  # one size for every chunk of the layout
    n = int.from_bytes(buf_a[8:12].numpy().tobytes(), "little")
    assert (buf_a[16 + n:] == 0).all()  # the padding is zeroed, not left as the buffer held it
    bf16_bytes = a.numel() * 2
    assert buf_a.numel() < bf16_bytes / (3.5 if preset == "quant-k3v2" else 2.5), (buf_a.numel(), bf16_bytes)
    for src, out in ((a, out_a), (b, out_b)):
        assert out.dtype == src.dtype
        e = rel(out, src)
        assert 0 < e < bound, e
    # deterministic: the same chunk gives the same bytes
    again, _ = round_trip(s, a)
    assert torch.equal(again, buf_a)


def test_float32_and_float16_chunks_and_a_short_last_chunk():
    s = serde("quant-k4v4")
    for dtype in (torch.float32, torch.float16):
        src = chunk(3, dtype)
        _, out = round_trip(s, src)
        assert rel(out, src) < 0.12
    short = chunk(4, tokens=17)
    _, out = round_trip(s, short)
    assert rel(out, short) < 0.12
    assert s.estimate_serialized_size(layout(short)) < s.estimate_serialized_size(layout(chunk()))


def test_fp16_sinks_cost_bytes_and_round_trip():
    src = chunk(5)
    plain, sinks = serde("quant-k3v2"), serde("quant-k3v2", sinks=4)
    assert sinks.estimate_serialized_size(layout(src)) > plain.estimate_serialized_size(layout(src))
    _, out = round_trip(sinks, src)
    assert rel(out[:, :, :4], src[:, :, :4]) < 0.01  # the first tokens come back at fp16
    assert rel(out, src) < 0.35


def test_the_rate_is_fixed_by_the_preset():
    """Bytes per chunk from the container's bound: 4-bit K and V above 3/2-bit, both below bf16."""
    src = chunk()
    k4 = serde("quant-k4v4").estimate_serialized_size(layout(src))
    k3 = serde("quant-k3v2").estimate_serialized_size(layout(src))
    assert k3 < k4 < src.numel() * 2


@pytest.mark.parametrize("preset", e8lmc.EVICTION_PRESETS + e8lmc.TIER_PRESETS + ("nope",))
def test_presets_without_a_fixed_size_are_refused(preset):
    with pytest.raises(e8kv.E8kvError, match="preset"):
        e8lmc.SerdeConfig(preset=preset)


@pytest.mark.parametrize("kwargs,match", [
    ({"head_dim": 60}, "head_dim"), ({"head_dim": "128"}, "head_dim"), ({"rope_theta": -1}, "rope_theta"),
    ({"max_workers": 0}, "max_workers"), ({"sinks": -1}, "sinks"), ({"sinks": True}, "sinks"), ({"level": 3}, "unknown argument"), ({"preset": 3}, "preset")])
def test_bad_kwargs_are_refused(kwargs, match):
    with pytest.raises(e8kv.E8kvError, match=match):
        e8lmc.SerdeConfig.from_kwargs(kwargs)


@pytest.mark.parametrize("shape,dtype,match", [
    ((L, T, HEADS * D), torch.bfloat16, "MLA"), ((2, L, T, 100), torch.bfloat16, "head_dim"),
    ((2, L, T, HEADS * D), torch.int8, "dtype"), ((3, L, T, HEADS * D), torch.bfloat16, r"\[2, layers")])
def test_unsupported_layouts_are_refused(shape, dtype, match):
    with pytest.raises(e8kv.E8kvError, match=match):
        serde().estimate_serialized_size(types.SimpleNamespace(shapes=[torch.Size(shape)], dtypes=[dtype]))
    with pytest.raises(e8kv.E8kvError, match="one KV tensor"):
        serde().estimate_serialized_size(types.SimpleNamespace(shapes=[torch.Size(shape)] * 2, dtypes=[dtype] * 2))


def test_damaged_values_raise_and_leave_no_partial_chunk():
    s = serde()
    src = chunk()
    buf, _ = round_trip(s, src)
    n = int.from_bytes(buf[8:12].numpy().tobytes(), "little")
    cases = {"bad magic": lambda b: b.__setitem__(0, 0x00),
             "truncated": lambda b: b[8:12].copy_(torch.tensor(list((10 ** 8).to_bytes(4, "little")),
                                                                dtype=torch.uint8)),
             "tokens": lambda b: b[12:16].copy_(torch.tensor([T + 1, 0, 0, 0], dtype=torch.uint8)),
             "corrupt": lambda b: b.__setitem__(16 + n // 2, int(b[16 + n // 2]) ^ 0x40),
             "corrupt header": lambda b: b.__setitem__(16 + 12, int(b[16 + 12]) ^ 0x01)}
    for name, damage in cases.items():
        bad = buf.clone()
        damage(bad)
        out = torch.zeros_like(src)
        with pytest.raises(e8kv.E8kvError):
            s.deserialize(obj(bad), obj(out), None)
        print(name, "refused")
    # written by another preset: the container's configuration differs
    other = serde("quant-k4v4")
    obuf, _ = round_trip(other, src)
    with pytest.raises(e8kv.E8kvError):
        s.deserialize(obj(obuf), obj(torch.zeros_like(src)), None)
    # a dst buffer too small for the fixed size
    with pytest.raises(e8kv.E8kvError, match="needs"):
        s.serialize(obj(src), obj(torch.zeros(100, dtype=torch.uint8)), None)


def test_register_without_lmcache_is_a_clear_error():
    try:
        import lmcache  # noqa: F401
    except ImportError:
        with pytest.raises(e8kv.E8kvError, match="LMCache is not importable"):
            e8lmc.register()
    else:
        pytest.skip("LMCache is importable here: the registry test below covers register()")


# ---- through LMCache ----------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_port():
    server = os.environ.get("E8KV_REDIS_SERVER") or shutil.which("redis-server")
    if not server:
        pytest.skip("redis-server is not installed (Debian: redis-server; scripts/setup.sh installs it)")
    d = tempfile.mkdtemp(prefix="e8kv-lmcache-redis.")
    port = _free_port()
    p = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", f"{d}/redis.sock",
                          "--save", "", "--appendonly", "no", "--dir", d, "--daemonize", "no",
                          "--loglevel", "warning", "--logfile", f"{d}/redis.log"])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                assert p.poll() is None, open(f"{d}/redis.log").read()
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not start within 5 s")
        yield port
    finally:
        p.terminate()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def _wait(fn, *args, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = fn(*args)
        if r is not None and r != {}:
            return r
        time.sleep(0.005)
    raise TimeoutError(f"{fn.__name__} gave no result within {timeout} s")


class LMCacheRedis:
    """LMCache's own path for one L2 adapter: its JSON adapter config with a "serde" entry, parsed by
    its argument parser, the RESP (Redis) adapter from its factory, wrapped as its StorageManager
    wraps it (SerdeL2AdapterWrapper over create_serde_processor), an L1Manager in CPU memory."""

    def __init__(self, port, serde_config):
        import argparse

        from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
        from lmcache.v1.distributed.l1_manager import L1Manager
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import (add_l2_adapters_args,
                                                               parse_args_to_l2_adapters_config)
        from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
        from lmcache.v1.distributed.serde import create_serde_processor

        spec = {"type": "resp", "host": "127.0.0.1", "port": port, "num_workers": 2}
        if serde_config is not None:
            spec["serde"] = serde_config
        args = add_l2_adapters_args(argparse.ArgumentParser()).parse_args(["--l2-adapter", json.dumps(spec)])
        (cfg,) = parse_args_to_l2_adapters_config(args).adapters
        self.l1 = L1Manager(L1ManagerConfig(memory_config=L1MemoryManagerConfig(
            size_in_bytes=64 << 20, use_lazy=False, shm_name="")))
        self.adapter = create_l2_adapter(cfg, self.l1.get_l1_memory_desc())
        if cfg.serde_config is not None:
            self.adapter = SerdeL2AdapterWrapper(inner=self.adapter, serde=create_serde_processor(cfg.serde_config),
                                                 l1_manager=self.l1)

    def key(self, seed):
        from lmcache.v1.distributed.api import ObjectKey

        return ObjectKey(chunk_hash=seed.to_bytes(8, "little") * 4, model_name="e8kv-test", kv_rank=0)

    def store(self, key, src):
        from lmcache.v1.distributed.api import MemoryLayoutDesc
        from lmcache.v1.distributed.error import L1Error

        lay = MemoryLayoutDesc(shapes=[src.shape], dtypes=[src.dtype])
        err, o = self.l1.reserve_write([key], [False], lay)[key]
        assert err == L1Error.SUCCESS, err
        o.tensor.copy_(src)
        self.l1.finish_write([key])
        self.l1.reserve_read([key])
        self.adapter.submit_store_task([key], [o])
        (result,) = _wait(self.adapter.pop_completed_store_tasks).values()
        self.l1.finish_read([key])
        return result

    def load(self, key, like, seed):
        """(found, loaded chunk or None): lookup, then a load into a fresh L1 object."""
        from lmcache.v1.distributed.api import MemoryLayoutDesc
        from lmcache.v1.distributed.error import L1Error

        lay = MemoryLayoutDesc(shapes=[like.shape], dtypes=[like.dtype])
        found = _wait(self.adapter.query_lookup_and_lock_result, self.adapter.submit_lookup_and_lock_task([key],
                                                                                                      {0: lay}))
        if not found.test(0):
            return False, None
        dst_key = self.key(seed)
        err, dst = self.l1.reserve_write([dst_key], [False], lay)[dst_key]
        assert err == L1Error.SUCCESS, err
        dst.tensor.fill_(0)
        loaded = _wait(self.adapter.query_load_result, self.adapter.submit_load_task([key], [dst]))
        self.adapter.submit_unlock([key])
        out = dst.tensor.clone()
        self.l1.finish_write([dst_key])
        return True, (out if loaded.test(0) else None)

    def close(self):
        self.adapter.close()


@pytest.fixture(scope="module")
def lmcache_registered():
    pytest.importorskip("lmcache", reason="LMCache is not installed (scripts/lmcache-venv.sh)")
    from lmcache.v1.distributed.serde import get_registered_serde_types

    assert e8lmc.register() == "e8kv"
    assert e8lmc.register() == "e8kv"  # a second call is a no-op
    assert "e8kv" in get_registered_serde_types()
    with pytest.raises(e8kv.E8kvError, match="already registered"):
        e8lmc.register("e8kv-other")


def _redis_values(port):
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    return r, {k: r.strlen(k) for k in r.scan_iter()}


@pytest.mark.parametrize("preset", ["quant-k3v2", "quant-k4v4"])
def test_chunk_round_trip_through_lmcache_redis(lmcache_registered, redis_port, preset):
    src = chunk(7)
    lm = LMCacheRedis(redis_port, {"type": "e8kv", "preset": preset, "head_dim": D})
    try:
        key = lm.key(1)
        assert lm.store(key, src).is_successful()
        r, values = _redis_values(redis_port)
        (stored,) = values.values()
        direct = serde(preset)
        assert stored == direct.estimate_serialized_size(layout(src))  # the fixed size, in Redis
        found, out = lm.load(key, src, 2)
        assert found and out is not None
        # what came back through LMCache and Redis is exactly the serde's own decode
        _, expect = round_trip(direct, src)
        assert torch.equal(out.view(src.dtype).view(src.shape), expect)
        assert rel(expect, src) < (0.35 if preset == "quant-k3v2" else 0.12)
        # a value damaged in Redis: LMCache reports the chunk as not loaded, nothing wrong comes back
        (rkey,) = values.keys()
        byte = r.getrange(rkey, 100, 100)
        r.setrange(rkey, 100, bytes([byte[0] ^ 0x10]))
        found, out = lm.load(key, src, 3)
        assert found and out is None
        # an absent chunk is a miss
        found, _ = lm.load(lm.key(99), src, 4)
        assert not found
    finally:
        lm.close()


def test_lmcache_refuses_an_eviction_preset_at_configuration(lmcache_registered, redis_port):
    with pytest.raises(e8kv.E8kvError, match="evicts tokens"):
        LMCacheRedis(redis_port, {"type": "e8kv", "preset": "balanced", "head_dim": D})
