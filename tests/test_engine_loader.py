"""Checkpoint loading: safetensors only, names and shapes checked, tied and sharded
checkpoints."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from refimpl.engine import LLM, Qwen3ModelConfig, SamplingParams, make_tiny_model


def read_weights(path) -> dict[str, torch.Tensor]:
    with safe_open(path / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def copy_without_weights(src, dst):
    dst.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def greedy(path, prompt="Paged KV", n=8):
    llm = LLM(path, device="cpu", kvcache_block_size=4, num_kvcache_blocks=16)
    return llm, llm.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=n), use_tqdm=False
    )[0]["token_ids"]


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
        LLM(path, device="cpu")
    assert not marker.exists()


def test_missing_unexpected_and_misshapen_tensors(tiny_dir, tmp_path):
    weights = read_weights(tiny_dir)
    cases = {
        "missing": (
            {
                k: v
                for k, v in weights.items()
                if k != "model.layers.1.self_attn.k_norm.weight"
            },
            "does not set 1 parameters",
        ),
        "unexpected": (
            {**weights, "model.layers.7.mlp.gate_proj.weight": torch.zeros(2, 2)},
            "does not have",
        ),
        "misshapen": (
            {**weights, "model.norm.weight": torch.ones(63)},
            r"checkpoint shape \(63,\)",
        ),
    }
    for name, (tensors, message) in cases.items():
        path = copy_without_weights(tiny_dir, tmp_path / name)
        save_file(tensors, str(path / "model.safetensors"))
        with pytest.raises(ValueError, match=message):
            LLM(path, device="cpu")
    empty = copy_without_weights(tiny_dir, tmp_path / "empty")
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        LLM(empty, device="cpu")


def test_sharded_checkpoint_loads_like_one_file(tiny_dir, tmp_path):
    weights = read_weights(tiny_dir)
    names = sorted(weights)
    path = copy_without_weights(tiny_dir, tmp_path / "sharded")
    save_file(
        {k: weights[k] for k in names[::2]}, str(path / "model-00001-of-00002.safetensors")
    )
    save_file(
        {k: weights[k] for k in names[1::2]}, str(path / "model-00002-of-00002.safetensors")
    )
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
    save_file(
        {**weights, "lm_head.weight": weights["model.embed_tokens.weight"].clone()},
        str(path / "model.safetensors"),
    )
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


# Qwen/Qwen3-0.6B's config.json as published on the Hugging Face Hub (transformers 4.51
# layout).
QWEN3_0_6B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


def test_a_published_qwen3_config_json_parses():
    cfg = Qwen3ModelConfig.from_dict(QWEN3_0_6B_CONFIG)
    assert (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.head_dim,
        cfg.num_kv_groups,
    ) == (151936, 1024, 28, 128, 2)
    assert (cfg.tie_word_embeddings, cfg.eos_token_id, cfg.rope_theta, cfg.torch_dtype) == (
        True,
        151645,
        1e6,
        "bfloat16",
    )


def test_a_hub_style_checkpoint_directory_loads_and_matches_transformers(tmp_path):
    """The files of a Hub Qwen3 repo: the published config.json format, bfloat16 weights in
    shards named by model.safetensors.index.json, and a pickled copy of the weights. The index
    decides which files are read (a stray .safetensors is ignored) and the pickle is never
    opened."""
    from refimpl.engine.oracle import hf_greedy, load_hf_model

    src = make_tiny_model(tmp_path / "src", seed=3, tie_word_embeddings=True, dtype="bfloat16")
    path = copy_without_weights(src, tmp_path / "hub-layout")
    tiny = json.loads((src / "config.json").read_text())
    sizes = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rope_theta",
        "bos_token_id",
        "eos_token_id",
    )
    (path / "config.json").write_text(
        json.dumps({**QWEN3_0_6B_CONFIG, **{k: tiny[k] for k in sizes}}, indent=2)
    )
    weights = read_weights(src)
    assert weights["model.norm.weight"].dtype == torch.bfloat16
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, str(path / shard), metadata={"format": "pt"})
    index = {
        "metadata": {
            "total_size": sum(t.numel() * t.element_size() for t in weights.values())
        },
        "weight_map": {k: shard for shard, keys in shards.items() for k in keys},
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({"not.a.parameter": torch.zeros(1)}, str(path / "consolidated.safetensors"))
    marker = tmp_path / "unpickled.txt"
    (path / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))

    llm, tokens = greedy(path, n=6)
    assert (
        llm.model_runner.model.lm_head.weight
        is llm.model_runner.model.model.embed_tokens.weight
    )
    assert tokens == hf_greedy(load_hf_model(path), llm.tokenizer.encode("Paged KV"), 6)
    assert not marker.exists()
    # An index naming a shard that is not there is a clear error.
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="names shard files that are not there"):
        LLM(path, device="cpu")


def test_a_truncated_checkpoint_gets_one_clear_line(tiny_dir, tmp_path):
    """A download cut short is named as such before any tensor is read, for both engines
    (they share `safetensors_files`), instead of a raw SafetensorError."""
    from refimpl.engine.loader import safetensors_files

    shutil.copytree(tiny_dir, tmp_path / "m")
    (weights,) = (tmp_path / "m").glob("*.safetensors")
    data = weights.read_bytes()
    for cut, match in [
        (len(data) - 1, "is truncated: it holds"),
        (3, "is truncated or not a safetensors file: 3 bytes"),
    ]:
        weights.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=f"{weights.name} {match}"):
            safetensors_files(tmp_path / "m")
        with pytest.raises(ValueError, match=match):
            LLM(str(tmp_path / "m"), device="cpu")
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(ValueError, match="its header is unreadable"):
        safetensors_files(tmp_path / "m")
