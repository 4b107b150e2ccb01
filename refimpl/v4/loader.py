"""Load a DeepSeek V4 checkpoint the way Part I's `LLM` loads Qwen3: a local directory,
safetensors only.

`check_v4_checkpoint` refuses, with one line each and before anything is read: a path that is
not a local directory (V4LLM never goes to the Hugging Face Hub), a directory without
config.json, a config of another model (a Qwen3 checkpoint, say), and weights that are only
pickles (`pytorch_model.bin`: unpickling can run code; Part I's `safetensors_files` decides).
`load_hf_model` then has transformers build its `DeepseekV4ForCausalLM` from that directory
only.
"""

from __future__ import annotations

import json
import os

import torch

from refimpl.engine.loader import safetensors_files

MODEL_TYPE = "deepseek_v4"


def check_v4_checkpoint(model: str | os.PathLike) -> str:
    """The directory as a string, once it is a local DeepSeek V4 safetensors checkpoint."""
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(
            "model must be the path of a local checkpoint directory, got "
            f"{type(model).__name__}"
        )
    path = os.fspath(model)
    if not os.path.isdir(path):
        raise ValueError(
            f"model must be a local checkpoint directory; {path!r} is not one "
            f"(V4LLM never downloads from the Hugging Face Hub)"
        )
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ValueError(f"{path} is not a model directory: it has no config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            raw = json.load(f)
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type != MODEL_TYPE:
        raise ValueError(
            f"{path} holds a {model_type!r} checkpoint; V4LLM runs only DeepSeek V4 "
            f"(model_type {MODEL_TYPE!r}; refimpl.engine.LLM runs Qwen3)"
        )
    safetensors_files(path)  # ValueError for pickled weights only, or no weights at all
    return path


def load_hf_model(model_dir: str | os.PathLike):
    """transformers' DeepseekV4ForCausalLM in float32, eager attention, eval mode, from
    `model_dir` only."""
    import warnings

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    path = check_v4_checkpoint(model_dir)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(
            path,
            attn_implementation="eager",
            dtype=torch.float32,
            local_files_only=True,
            use_safetensors=True,
        )
    return model.eval()
