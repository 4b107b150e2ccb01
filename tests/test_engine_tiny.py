"""make_tiny_model: a checkpoint directory that transformers and refimpl both load, offline."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from refimpl.engine import LLM, SamplingParams, build_byte_tokenizer, make_tiny_model
from refimpl.engine.tiny import EOS_TOKEN_ID, TINY_DEFAULTS


def test_writes_a_hugging_face_checkpoint_directory(tiny_dir):
    names = sorted(p.name for p in tiny_dir.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is False
    assert config["vocab_size"] == 256 + 3 and config["eos_token_id"] == EOS_TOKEN_ID == 256
    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" in keys  # untied: the output projection is its own matrix
        assert not torch.equal(
            f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
        )
    # 1 embedding + 11 tensors per layer + final norm + lm_head
    assert len(keys) == 1 + 11 * TINY_DEFAULTS["num_hidden_layers"] + 1 + 1


def test_transformers_loads_tokenizer_and_model_offline(tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tokenizer) == 259 and tokenizer.eos_token_id == 256
    text = "héllo, KV <|im_end|>"
    ids = tokenizer.encode(text)
    assert ids[:7] == list("héllo,".encode()) and ids[-1] == 258  # bytes are their own ids
    assert tokenizer.decode(ids) == text
    model, info = AutoModelForCausalLM.from_pretrained(tiny_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.config.num_key_value_heads == 2 and model.config.head_dim == 16


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    c = make_tiny_model(tmp_path / "c", seed=4)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_sizes_and_errors(tmp_path):
    path = make_tiny_model(
        tmp_path / "wide",
        vocab_size=300,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_hidden_layers=1,
    )
    config = json.loads((path / "config.json").read_text())
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"]) == (
        300,
        32,
        1,
    )
    # ids above the specials are reserved tokens
    assert build_byte_tokenizer(300).get_vocab_size() == 300
    with pytest.raises(ValueError, match="unknown size arguments"):
        make_tiny_model(tmp_path / "x", hidden=32)
    with pytest.raises(ValueError, match="vocab_size must be at least 259"):
        make_tiny_model(tmp_path / "y", vocab_size=100)
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        make_tiny_model(tmp_path / "z", num_attention_heads=3, num_key_value_heads=2)


def test_refimpl_llm_loads_it_and_greedy_output_is_not_one_repeated_token(tiny_dir):
    llm = LLM(tiny_dir, device="cpu", kvcache_block_size=8, num_kvcache_blocks=32)
    out = llm.generate(
        ["Hello, paged world"], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False
    )
    assert len(set(out[0]["token_ids"])) > 4
    assert out[0]["text"] == llm.tokenizer.decode(out[0]["token_ids"])
