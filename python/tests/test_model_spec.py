"""e8kv.model_spec: a model's facts from any object with transformers' config field names, with
neither torch nor transformers importable (it runs in the numpy-only venv too)."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import e8kv
from e8kv import model_spec


def llama_like(**fields):
    base = dict(num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, hidden_size=512,
                rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    return SimpleNamespace(**{**base, **fields})


def test_shape_and_spec_of_a_plain_config():
    config = llama_like()
    assert model_spec.model_shape(config) == e8kv.ModelShape(3, 2, 8, 64)
    assert model_spec.model_shape(llama_like(num_key_value_heads=None, head_dim=32)) == (3, 8, 8, 32)
    assert model_spec.sliding_window_of(config) is None
    assert model_spec.rope_spec(config) == "rope_theta=500000"
    assert model_spec.make_spec(config, "quant-k3v2", "evict=0.5") == "preset=quant-k3v2,rope_theta=500000,evict=0.5"
    assert model_spec.make_spec(config, None, "rope=post") == "rope=post"


def test_rope_scaling_and_partial_rotary():
    config = llama_like(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192},
                        partial_rotary_factor=0.5)
    assert model_spec.rope_spec(config) == ("rope_theta=500000,rope_scaling=llama3,rope_factor=8,"
                                            "rope_low_freq_factor=1,rope_high_freq_factor=4,"
                                            "rope_original_max_position=8192,rope_dim=32")
    with pytest.raises(e8kv.E8kvError, match="rope=post"):
        model_spec.rope_spec(llama_like(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}))


def test_rope_theta_field_prints_ints_and_floats_alike():
    assert model_spec.rope_theta_field(500000) == model_spec.rope_theta_field(500000.0) == "rope_theta=500000"
    assert model_spec.rope_theta_field(1234567) == "rope_theta=1.23457e+06"


def test_refusals():
    assert model_spec.sliding_window_of(llama_like(sliding_window=16, layer_types=["sliding_attention"] * 3)) == 16
    with pytest.raises(e8kv.E8kvError, match="layer 1 is 'sliding_attention'"):
        model_spec.refuse_unsupported(llama_like(sliding_window=16,
                                                 layer_types=["full_attention"] + ["sliding_attention"] * 2))
    with pytest.raises(e8kv.E8kvError, match="attn_logit_softcapping=50"):
        model_spec.refuse_unsupported(llama_like(attn_logit_softcapping=50.0))


def test_imports_without_torch_or_transformers():
    # A fresh interpreter in which importing torch or transformers fails.
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "import e8kv.model_spec, e8kv.lmcache\n"
            "assert not any(m.split('.')[0] in ('torch', 'transformers') and sys.modules[m] is not None "
            "for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
