"""Checkpoint loading: safetensors only, names and shapes checked, tied and sharded checkpoints."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from refimpl.engine import LLM, Qwen3ModelConfig, SamplingParams, make_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def read_weights(path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def copy_without_weights(src, dst):
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def greedy(path, prompt="Paged KV", n=8):
    llm = LLM(path, kvcache_block_size=4, num_kvcache_blocks=16)
    return llm, llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n), use_tqdm=False)[0]["token_ids"]


class _Boom:
    """Unpickling this would create a file: proof that a loader unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickled_weights_are_refused_never_opened(tiny_dir, tmp_path):
    path = copy_without_weights(tiny_dir, tmp_path / "pickled")
    marker = tmp_path / "unpickled.txt"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(ValueError, match="never unpickles"):
        LLM(path)
    assert not marker.exists()


def test_missing_unexpected_and_misshapen_tensors(tiny_dir, tmp_path):
    weights = read_weights(tiny_dir)
    cases = {
        "missing": ({k: v for k, v in weights.items() if k != "model.layers.1.self_attn.k_norm.weight"},
                    "does not set 1 parameters"),
        "unexpected": ({**weights, "model.layers.7.mlp.gate_proj.weight": torch.zeros(2, 2)}, "does not have"),
        "misshapen": ({**weights, "model.norm.weight": torch.ones(63)}, r"checkpoint shape \(63,\)"),
    }
    for name, (tensors, message) in cases.items():
        path = copy_without_weights(tiny_dir, tmp_path / name)
        save_file(tensors, str(path / "model.safetensors"))
        with pytest.raises(ValueError, match=message):
            LLM(path)
    empty = copy_without_weights(tiny_dir, tmp_path / "empty")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        LLM(empty)


def test_sharded_checkpoint_loads_like_one_file(tiny_dir, tmp_path):
    weights = read_weights(tiny_dir)
    names = sorted(weights)
    path = copy_without_weights(tiny_dir, tmp_path / "sharded")
    save_file({k: weights[k] for k in names[::2]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: weights[k] for k in names[1::2]}, str(path / "model-00002-of-00002.safetensors"))
    assert greedy(path)[1] == greedy(tiny_dir)[1]


def test_tied_embeddings_share_one_matrix_with_or_without_a_stored_copy(tmp_path):
    path = make_tiny_model(tmp_path / "tied", seed=2, tie_word_embeddings=True)
    weights = read_weights(path)
    assert "lm_head.weight" not in weights
    llm, tokens = greedy(path)
    model = llm.model_runner.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, weights["model.embed_tokens.weight"])
    # Some tied checkpoints store the redundant copy anyway: it is skipped, output unchanged.
    save_file({**weights, "lm_head.weight": weights["model.embed_tokens.weight"].clone()}, str(path / "model.safetensors"))
    assert greedy(path)[1] == tokens


def test_config_parsing_both_transformers_layouts_and_rejections(tiny_dir):
    raw = json.loads((tiny_dir / "config.json").read_text())
    legacy = Qwen3ModelConfig.from_dict(raw)
    assert (legacy.rope_theta, legacy.num_kv_groups, legacy.eos_token_id) == (10000.0, 2, 256)
    v5 = {k: v for k, v in raw.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    v5["eos_token_id"] = [256, 258]
    assert Qwen3ModelConfig.from_dict(v5) == legacy
    with pytest.raises(ValueError, match=r"lacks \['hidden_size'\]"):
        Qwen3ModelConfig.from_dict({k: v for k, v in raw.items() if k != "hidden_size"})
    for change, message in (
        ({"model_type": "llama"}, "only Qwen3"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "default rotary"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"head_dim": 15}, "even"),
    ):
        with pytest.raises(ValueError, match=message):
            Qwen3ModelConfig.from_dict({**raw, **change})
