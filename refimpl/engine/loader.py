"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into our model.

Only safetensors files are read: they hold raw tensors and metadata, nothing executable.
PyTorch `.bin`/`.pt` files are pickles, and unpickling a downloaded file can run arbitrary
code, so they are refused, never opened. Sharded checkpoints (model-00001-of-00004.safetensors,
... listed in model.safetensors.index.json) load the same way: every tensor is copied to the
parameter of the same name.
"""

from __future__ import annotations

import glob
import json
import os

import torch
from safetensors import safe_open
from torch import nn

# Checkpoint entries that are not parameters of our model and carry nothing we need.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# a sharded checkpoint's map: tensor name -> shard file
SHARD_INDEX = "model.safetensors.index.json"


def check_safetensors_file(path: str) -> None:
    """Refuse a file that is not a whole safetensors file, from its header alone.

    The format is an 8-byte little-endian header length, a JSON header giving every tensor's
    byte range (`data_offsets`), then the data. A download cut short holds less than its header
    describes; the safetensors library would say so only as a raw `SafetensorError` when the
    file is opened.
    """
    name = os.path.basename(path)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        header_len = int.from_bytes(head, "little") if len(head) == 8 else -1
        if header_len < 0 or 8 + header_len > size:
            raise ValueError(
                f"{name} is truncated or not a safetensors file: {size} bytes, too short for "
                "its header"
            )
        try:
            header = json.loads(f.read(header_len))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                default=0,
            )
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            raise ValueError(
                f"{name} is not a safetensors file: its header is unreadable"
            ) from None
    if 8 + header_len + end > size:
        raise ValueError(
            f"{name} is truncated: it holds {size} bytes but its header describes "
            f"{8 + header_len + end} (download it again)"
        )


def safetensors_files(model_dir: str | os.PathLike) -> list[str]:
    """The checkpoint's safetensors files, sorted, each checked whole
    (`check_safetensors_file`); a clear error when there are none.

    A sharded checkpoint names its shards in `model.safetensors.index.json`; then only those
    files are read (as transformers does), so a stray extra .safetensors file is ignored.
    """
    files = _safetensors_files(model_dir)
    for path in files:
        check_safetensors_file(path)
    return files


def _safetensors_files(model_dir: str | os.PathLike) -> list[str]:
    """The files `safetensors_files` returns, unchecked."""
    index_path = os.path.join(model_dir, SHARD_INDEX)
    if os.path.isfile(index_path):
        with open(index_path, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        missing = [
            name for name in shards if not os.path.isfile(os.path.join(model_dir, name))
        ]
        if not shards:
            raise ValueError(
                f"{SHARD_INDEX} in {model_dir!s} lists no shard files in its weight_map"
            )
        if missing:
            raise ValueError(
                f"{SHARD_INDEX} in {model_dir!s} names shard files that are not there: "
                f"{missing}"
            )
        return [os.path.join(model_dir, name) for name in shards]
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        return files
    pickles = sorted(
        os.path.basename(p)
        for pattern in ("*.bin", "*.pt", "*.pth")
        for p in glob.glob(os.path.join(model_dir, pattern))
    )
    if pickles:
        raise ValueError(
            f"{model_dir!s} has only pickled weights ({', '.join(pickles)}); refimpl loads "
            "*.safetensors only "
            f"and never unpickles files. Convert the checkpoint to safetensors first."
        )
    raise ValueError(f"{model_dir!s} has no *.safetensors weight files")


@torch.no_grad()
def load_model(model: nn.Module, model_dir: str | os.PathLike) -> None:
    """Copy every checkpoint tensor into the parameter with the same name.

    Raises ValueError for a tensor the model does not have, a shape mismatch, or a parameter
    the checkpoint leaves unset. With tied embeddings the model has no separate
    `lm_head.weight` (it is the embedding matrix); a copy stored in the checkpoint anyway is
    skipped.
    """
    params = dict(model.named_parameters())  # a tied weight appears once, under its first name
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    loaded: set[str] = set()
    for path in safetensors_files(model_dir):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                tensor = f.get_tensor(name)
                if name == "lm_head.weight" and tied and name not in params:
                    continue  # a redundant copy of the tied embedding matrix
                if name not in params:
                    raise ValueError(
                        f"{os.path.basename(path)} has tensor {name!r}, which this Qwen3 "
                        "model does not have"
                    )
                param = params[name]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape "
                        f"{tuple(param.shape)} "
                        f"(does config.json match the weights?)"
                    )
                param.copy_(tensor)
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(
            f"the checkpoint in {model_dir!s} does not set {len(missing)} parameters: "
            f"{missing[:5]}"
        )
