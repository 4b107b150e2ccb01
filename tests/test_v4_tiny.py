"""make_tiny_v4 writes a checkpoint transformers loads, with no weight left at a hiding
value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from refimpl.v4.tiny import make_tiny_v4, tiny_v4_config_dict
from tests.v4_models import hf_model, model_dir


def test_transformers_loads_it_with_the_layer_mix():
    model = hf_model("A")
    assert type(model).__name__ == "DeepseekV4ForCausalLM"
    assert model.config.layer_types == [
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ]
    assert model.config.mlp_layer_types == ["hash_moe", "hash_moe", "moe", "moe"]
    assert model.config.sliding_window == 16 and model.config.index_topk == 4
    config = json.loads((Path(model_dir("A")) / "config.json").read_text())
    assert config["model_type"] == "deepseek_v4"


def test_no_weight_hides_a_path():
    state = hf_model("A").state_dict()
    for name, t in state.items():
        if name.endswith(
            ("sinks", "position_bias", "base", "hc_base", "e_score_correction_bias")
        ):
            assert (t != 0).all(), name
        if name.endswith(("scale", "hc_scale")) or "norm" in name:
            assert (t != 1).all() and (t != 0).all(), name
        if name.endswith("tid2eid"):
            # distinct experts
            assert all(len(set(row.tolist())) == row.numel() for row in t), name
            assert len({tuple(row.tolist()) for row in t}) > 1, name
    assert any(name.endswith("tid2eid") for name in state)


def test_same_seed_same_weights_and_generation(tmp_path):
    make_tiny_v4(
        tmp_path / "again",
        seed=0,
        compress_ratios=(0, 4, 128, 4),
        sliding_window=16,
        index_topk=4,
    )
    from refimpl.v4.loader import load_hf_model

    again = load_hf_model(str(tmp_path / "again"))
    ref = hf_model("A").state_dict()
    assert all(torch.equal(t, ref[n]) for n, t in again.state_dict().items())
    ids = torch.tensor([[72, 101, 108, 108, 111]])
    with torch.no_grad():
        out = again.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=256)
    assert out.shape == (1, 9)


@pytest.mark.parametrize(
    "bad",
    [
        dict(compress_ratios=(0, 8)),
        dict(compress_ratios=()),
        dict(qk_rope_head_dim=7),
        dict(colour=1),
    ],
)
def test_bad_sizes_raise(bad):
    with pytest.raises(ValueError):
        tiny_v4_config_dict(**bad)
