"""e8kv.kvpress.E8Press inside kvpress 0.5 (its venv pins transformers < 5.3): the press codes each
layer's prefill, the cache then holds e8kv's decoded rows, and bits_per_element is e8kv's own
byte count over the prefill's elements."""
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("kvpress")

import e8kv  # noqa: E402
from e8kv.kvpress import E8Press  # noqa: E402
from kvpress import SnapKVPress  # noqa: E402
from test_hf import ids, tiny_llama  # noqa: E402
from transformers import DynamicCache  # noqa: E402


def prefill(model, x, press=None):
    cache = DynamicCache()
    with torch.no_grad():
        if press is None:
            model(x, past_key_values=cache)
        else:
            with press(model):
                model(x, past_key_values=cache)
    return cache


def test_press_codes_every_layer_and_counts_bits():
    model = tiny_llama()
    x = ids(2, 200)
    dense = prefill(model, x)
    press = E8Press("preset=quant-k3v2")
    coded = prefill(model, x, press)
    for d, c in zip(dense.layers, coded.layers):
        assert c.keys.shape == d.keys.shape
        rel = float((c.values - d.values).norm() / d.values.norm())
        assert 0 < rel < 0.4, rel
    # the same prefill coded by a one-layer compressor directly: the press's bytes are its bytes
    layer0 = e8kv.Compressor((1, 2, 4, 64), "preset=quant-k3v2,rope_theta=10000")
    assert press.layer_elements[0] == 2 * 2 * 2 * 200 * 64
    assert 2.5 < press.bits_per_element < 6
    assert press.nbytes == sum(press.layer_bytes) and len(press.layer_bytes) == 3
    assert layer0.shape.n_layers == 1


def test_press_after_a_scorer_press_keeps_its_rows():
    model = tiny_llama()
    x = ids(1, 200)
    press = E8Press("preset=quant-k4v4", base_press=SnapKVPress(compression_ratio=0.5))
    coded = prefill(model, x, press)
    assert coded.layers[0].keys.shape[2] == 100
    full = E8Press("preset=quant-k4v4")
    prefill(model, x, full)
    assert 0.4 * full.bits_per_element < press.bits_per_element < 0.6 * full.bits_per_element


def test_cross_layer_specs_are_refused():
    with pytest.raises(e8kv.E8kvError, match="every layer"):
        E8Press("preset=quant-k3v2,budget=2.5")


def test_import_leaves_transformers_attention_alone():
    # e8kv.kvpress reads the model facts from e8kv.model_spec; importing e8kv.hf (which registers
    # "e8kv" with transformers' attention and mask interfaces) is for those who use it.
    code = ("import sys, e8kv.kvpress\n"
            "from transformers import AttentionInterface, AttentionMaskInterface\n"
            "assert 'e8kv.hf' not in sys.modules\n"
            "assert 'e8kv' not in AttentionInterface._global_mapping\n"
            "assert 'e8kv' not in AttentionMaskInterface._global_mapping\n")
    subprocess.run([sys.executable, "-c", code], check=True)
