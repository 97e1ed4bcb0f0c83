"""The numpy core of e8kv: round trips, attention against a brute-force reference with lse,
dtypes and array kinds, serialization, and every bad input (each must raise E8kvError, never crash).
numpy only: torch-dependent checks live in test_arrays_torch.py."""
import threading

import numpy as np
import pytest

import e8kv
from conftest import SHAPE, make_kv, reference_attention

L, HKV, HQ, D = SHAPE


def fp16(x):
    return x.astype(np.float16).astype(np.float32)


def test_presets_each_make_a_compressor():
    names = e8kv.presets()
    assert {"lossless", "quant-k3v2", "quant-k2v2", "high", "max", "tier-k3v2"} <= set(names)
    for name in names:
        c = e8kv.Compressor(SHAPE, f"preset={name}")
        assert "key=" in c.spec  # describe() gives every field back


def test_lossless_round_trip_is_fp16_rounding():
    k, v, q = make_kv(100)
    cache = e8kv.Compressor(SHAPE, "preset=lossless").compress(k, v, q)
    assert cache.original_tokens == 100 and cache.next_position == 100
    for layer in range(L):
        pos, kd, vd, mask = cache.decompress(layer)
        assert pos.tolist() == list(range(100))
        np.testing.assert_array_equal(kd, fp16(k[layer]))
        np.testing.assert_array_equal(vd, fp16(v[layer]))
        assert (mask == 0).all()


@pytest.mark.parametrize("spec", ["preset=lossless", "preset=quant-k3v2", "preset=quant-k2v2", "preset=high",
                                  "preset=tier-k3v2", "preset=quant-k3v2,per_head=1,evict=0.5"])
@pytest.mark.parametrize("tokens", [1, 17, 100])
def test_attend_equals_reference_over_decompressed_rows(spec, tokens):
    k, v, q = make_kv(tokens)
    cache = e8kv.Compressor(SHAPE, spec).compress(k, v, q)
    rng = np.random.default_rng(7)
    for layer in range(L):
        pos, kd, vd, mask = cache.decompress(layer)
        query = rng.standard_normal((HQ, D), dtype=np.float32)
        out, lse = cache.attend(layer, query, tokens, return_lse=True)
        ref, ref_lse = reference_attention(query, kd, vd, mask)
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-4)


def test_codes_are_lossy_but_close():
    k, v, q = make_kv(200)
    for spec, bound in (("preset=quant-k4v4", 0.12), ("preset=quant-k3v2", 0.4)):
        cache = e8kv.Compressor(SHAPE, spec).compress(k, v, q)
        _, kd, vd, _ = cache.decompress(0)
        rel = np.linalg.norm(vd - v[0]) / np.linalg.norm(v[0])
        assert 0 < rel < bound, (spec, rel)
        assert cache.bits_per_element < 6


def test_sizes_agree():
    k, v, q = make_kv(300)
    cache = e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(k, v, q)
    elements = 300 * L * HKV * D * 2
    assert cache.bits_per_element == pytest.approx(8 * cache.nbytes / elements, rel=1e-12)
    assert cache.compression_ratio == pytest.approx(16 / cache.bits_per_element, rel=1e-9)
    assert cache.stored_tokens(0, 0) == 300
    assert 0 < cache.serialized_size() == len(cache.to_bytes())


def test_multi_token_attend_and_attend_batch_equal_single_calls():
    k, v, q = make_kv(80)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    a, b = c.compress(k, v, q), c.compress(k[:, :50], v[:, :50], q)
    qs = np.random.default_rng(3).standard_normal((3, HQ, D), dtype=np.float32)
    many, lse = a.attend(1, qs, [80, 81, 82], return_lse=True)
    for t in range(3):
        one, one_lse = a.attend(1, qs[t], 80 + t, return_lse=True)
        np.testing.assert_array_equal(many[t], one)
        np.testing.assert_array_equal(lse[t], one_lse)
    results = e8kv.attend_batch([(a, 0, qs, None), e8kv.AttendRequest(b, 1, qs[:1], [50])])
    np.testing.assert_array_equal(results[0][0][2], a.attend(0, qs[2], 99))
    np.testing.assert_array_equal(results[1][0][0], b.attend(1, qs[0], 50))
    assert e8kv.Cache.attend_batch([]) == []


def test_merge_attention_of_two_halves_equals_the_whole():
    k, v, q = make_kv(64)
    c = e8kv.Compressor(SHAPE, "preset=lossless")
    first = c.compress(k[:, :40], v[:, :40], q)
    second = c.compress(k[:, 40:], v[:, 40:], q, first_position=40)
    query = np.random.default_rng(5).standard_normal((HQ, D), dtype=np.float32)
    oa, la = first.attend(0, query, 64, return_lse=True)
    ob, lb = second.attend(0, query, 64, return_lse=True)
    out, lse = e8kv.merge_attention(oa, la, ob, lb)
    ref, ref_lse = reference_attention(query, fp16(k[0]), fp16(v[0]))
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)


def test_float16_input_equals_float32_of_the_same_values():
    k, v, q = make_kv(70)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    a = c.compress(fp16(k), fp16(v), fp16(q))
    b = c.compress(k.astype(np.float16), v.astype(np.float16), q.astype(np.float16))
    assert a.to_bytes() == b.to_bytes()
    query = q[0, -1]
    np.testing.assert_array_equal(a.attend(0, fp16(query), 70), b.attend(0, query.astype(np.float16), 70))


def test_strided_and_foreign_arrays_equal_contiguous_numpy():
    k, v, q = make_kv(60)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    base = c.compress(k, v, q).to_bytes()
    # head_dim strided (every other element of a wider array), reversed token order reversed back
    wide = np.zeros((L, 60, HKV, 2 * D), np.float32)
    wide[..., ::2] = k
    rev = v[:, ::-1][:, ::-1]
    assert c.compress(wide[..., ::2], rev, q).to_bytes() == base

    class DLPackOnly:  # anything with __dlpack__ (here delegating to numpy)
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    layers_k = [DLPackOnly(k[i]) for i in range(L)]
    layers_v = [memoryview(np.ascontiguousarray(v[i])) for i in range(L)]  # the buffer protocol
    assert c.compress(layers_k, layers_v, list(q)).to_bytes() == base


def test_serialization_round_trip():
    k, v, q = make_kv(90)
    c = e8kv.Compressor(SHAPE, "preset=high")
    cache = c.compress(k, v, q)
    blob = cache.to_bytes()
    query = q[1, -1]
    for again in (e8kv.Cache.from_bytes(blob, c), e8kv.Cache.from_bytes(bytearray(blob))):
        np.testing.assert_array_equal(again.attend(1, query, 90), cache.attend(1, query, 90))
        assert again.nbytes == cache.nbytes and again.to_bytes() == blob
        assert again.next_position == 90
    orphan = e8kv.Cache.from_bytes(blob)
    with pytest.raises(e8kv.E8kvError, match="without a compressor"):
        orphan.append(0, k[0, 0], v[0, 0], 90)
    orphan.append(0, k[0, 0], v[0, 0], 90, compressor=c)
    other = e8kv.Compressor(SHAPE, "preset=quant-k2v2")
    with pytest.raises(e8kv.E8kvError, match="another configuration"):
        e8kv.Cache.from_bytes(blob, other)


def test_damaged_containers_are_refused():
    k, v, q = make_kv(50)
    blob = bytearray(e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(k, v, q).to_bytes())
    rng = np.random.default_rng(11)
    for _ in range(40):
        bad = bytearray(blob)
        i = int(rng.integers(len(bad)))
        bad[i] ^= 1 << int(rng.integers(8))
        with pytest.raises(e8kv.E8kvError) as e:
            e8kv.Cache.from_bytes(bytes(bad))
        assert e.value.status in ("corrupt data", "unsupported", "invalid argument")
    for cut in (0, 1, 20, len(blob) - 1):
        with pytest.raises(e8kv.E8kvError):
            e8kv.Cache.from_bytes(bytes(blob[:cut]))
    with pytest.raises(e8kv.E8kvError, match="expected bytes"):
        e8kv.Cache.from_bytes(12345)


def test_append_and_extend():
    k, v, q = make_kv(120)
    c = e8kv.Compressor(SHAPE, "preset=lossless")
    whole = c.compress(k, v, q)
    part = c.compress(k[:, :100], v[:, :100], q)
    part.extend(k[:, 100:110], v[:, 100:110])
    assert part.next_position == 110
    for t in range(110, 120):
        for layer in range(L):
            part.append(layer, k[layer, t], v[layer, t], t)
    assert part.original_tokens == 120
    for layer in range(L):
        np.testing.assert_array_equal(part.decompress(layer)[1], whole.decompress(layer)[1])


def test_failed_calls_leave_the_cache_as_it_was():
    k, v, q = make_kv(40)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    cache = c.compress(k, v, q)
    before = cache.to_bytes()
    with pytest.raises(e8kv.E8kvError, match="position"):
        cache.append(0, k[0, 0], v[0, 0], 10)  # precedes stored positions
    bad = k[0, 0].copy()
    bad[1, 3] = np.nan
    with pytest.raises(e8kv.E8kvError) as e:
        cache.append(0, bad, v[0, 0], 40)
    assert e.value.status == "invalid argument"
    assert cache.to_bytes() == before


@pytest.mark.parametrize("make, fragment", [
    (lambda k, v, q: (k.astype(np.float64), v, q), "dtype float64"),
    (lambda k, v, q: (k.astype(np.int32), v, q), "dtype int32"),
    (lambda k, v, q: (k[:, :, :1], v, q), "shape"),
    (lambda k, v, q: (k[..., :32], v, q), "shape"),
    (lambda k, v, q: (k[:1], v, q), "layers"),
    (lambda k, v, q: (k, v[:, :5], q), "shape"),
    (lambda k, v, q: (k[0], v, q), "dimensions"),
    (lambda k, v, q: (k, v, q[:, :, :2]), "shape"),
    (lambda k, v, q: (k, v, q[:, :0]), "no token"),
    (lambda k, v, q: (k, v.astype(np.float16), q), "dtype"),
    (lambda k, v, q: ("keys", v, q), "str"),
    (lambda k, v, q: (object(), v, q), "object"),
])
def test_bad_compress_arguments(make, fragment):
    k, v, q = make_kv(30)
    with pytest.raises(e8kv.E8kvError, match=fragment):
        e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(*make(k, v, q))


@pytest.mark.parametrize("where", ["keys", "values", "queries"])
@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_inputs_are_refused(where, value):
    k, v, q = make_kv(30)
    {"keys": k, "values": v, "queries": q}[where][1, 3, 1, 7] = value
    with pytest.raises(e8kv.E8kvError) as e:
        e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(k, v, q)
    assert e.value.status == "invalid argument" and "e8kv_compress" in str(e.value)


def test_bad_attend_arguments():
    k, v, q = make_kv(30)
    cache = e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(k, v, q)
    good = q[0, 0]
    cases = [((5, good, 30), "layer"), ((0, good, 3), "position"), ((0, good[:2], 30), "shape"),
             ((0, good.astype(np.float64), 30), "float64"), ((0, good, 2**40), "int32"), (("0", good, 30), "str"),
             ((0, np.full((HQ, D), np.nan, np.float32), 30), "e8kv_attend")]
    for args, fragment in cases:
        with pytest.raises(e8kv.E8kvError, match=fragment):
            cache.attend(*args)
    with pytest.raises(e8kv.E8kvError, match="positions"):
        cache.attend(0, q[0, :3], [30, 31])
    with pytest.raises(e8kv.E8kvError, match="expected e8kv.Cache"):
        e8kv.attend_batch([("cache", 0, q[0, :1], None)])
    with pytest.raises(e8kv.E8kvError, match="layer"):
        cache.decompress(-1)


def test_bad_compressor_arguments():
    with pytest.raises(e8kv.E8kvError, match="head_dim"):
        e8kv.Compressor((2, 2, 4, 65), "")
    with pytest.raises(e8kv.E8kvError, match="multiple"):
        e8kv.Compressor((2, 3, 4, 64), "")
    with pytest.raises(e8kv.E8kvError, match="evict"):
        e8kv.Compressor(SHAPE, "preset=high,evict=2")
    with pytest.raises(e8kv.E8kvError, match="no-such-preset.*lossless"):
        e8kv.Compressor(SHAPE, "preset=no-such-preset")
    with pytest.raises(e8kv.E8kvError, match="4 integers"):
        e8kv.Compressor((2, 2, 4), "")
    with pytest.raises(e8kv.E8kvError, match="shape must be"):
        e8kv.Compressor(None, "")
    with pytest.raises(e8kv.E8kvError, match="spec is a int"):
        e8kv.Compressor(SHAPE, 3)
    with pytest.raises(e8kv.E8kvError, match="threads"):
        e8kv.ThreadPool(0)
    with pytest.raises(e8kv.E8kvError, match="e8kv.ThreadPool"):
        e8kv.Compressor(SHAPE, "").compress(*make_kv(10), pool=4)
    with pytest.raises(TypeError):
        e8kv.Cache()


def test_closed_objects_raise():
    k, v, q = make_kv(30)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    pool = e8kv.ThreadPool(2)
    cache = c.compress(k, v, q, pool=pool)
    cache.close()
    cache.close()  # twice is fine
    assert cache.closed and "closed" in repr(cache)
    for call in (lambda: cache.attend(0, q[0, 0], 30), lambda: cache.to_bytes(), lambda: cache.nbytes,
                 lambda: cache.append(0, k[0, 0], v[0, 0], 30), lambda: cache.decompress(0)):
        with pytest.raises(e8kv.E8kvError, match="cache is closed"):
            call()
    live = c.compress(k, v, q)
    c.close()
    with pytest.raises(e8kv.E8kvError, match="compressor is closed"):
        c.compress(k, v, q)
    with pytest.raises(e8kv.E8kvError, match="compressor is closed"):
        live.append(0, k[0, 0], v[0, 0], 30)
    live.attend(0, q[0, 0], 30)  # a cache does not need its compressor to attend
    pool.close()
    with pytest.raises(e8kv.E8kvError, match="thread pool is closed"):
        live.attend(0, q[0, 0], 30, pool=pool)
    assert pool.closed
    with e8kv.Compressor(SHAPE, "") as c2, c2.compress(k, v) as cache2, e8kv.ThreadPool(1) as pool2:
        assert cache2.original_tokens == 30 and not (c2.closed or cache2.closed or pool2.closed)
    assert cache2.closed and c2.closed and pool2.closed


def test_threads_read_concurrently_and_writers_wait():
    k, v, q = make_kv(3000, shape=SHAPE)
    c = e8kv.Compressor(SHAPE, "preset=quant-k3v2")
    cache = c.compress(k, v, q)
    queries = np.random.default_rng(9).standard_normal((64, HQ, D), dtype=np.float32)
    expected = cache.attend(0, queries, list(range(3000, 3064)))
    results, errors = {}, []

    def reader(i):
        try:
            for _ in range(3):
                results[i] = cache.attend(0, queries, list(range(3000, 3064)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def writer():
        try:
            for t in range(3000, 3020):
                cache.append(1, k[1, 0], v[1, 0], t)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results.values():
        np.testing.assert_array_equal(r, expected)  # layer 0 untouched by the writer of layer 1
    assert cache.stored_tokens(1, 0) == 3020


def test_close_while_another_thread_attends():
    k, v, q = make_kv(4000)
    cache = e8kv.Compressor(SHAPE, "preset=quant-k3v2").compress(k, v, q)
    queries = np.random.default_rng(2).standard_normal((256, HQ, D), dtype=np.float32)
    started, outcome = threading.Event(), []

    def reader():
        started.set()
        try:
            for _ in range(20):
                cache.attend(0, queries, list(range(4000, 4256)))
            outcome.append("finished")
        except e8kv.E8kvError as e:
            outcome.append(str(e))

    t = threading.Thread(target=reader)
    t.start()
    started.wait()
    cache.close()  # waits for a running attend, never frees under it
    t.join()
    assert outcome and (outcome[0] == "finished" or "cache is closed" in outcome[0])
    assert cache.closed


def test_version():
    assert e8kv.library_version().count(".") == 2
    assert e8kv.format_version() >= 3
