"""An estimate of one GPU's weight bytes from a config.json, quantisation included.

`plan --gpu-memory` needs the weights to guess the KV budget (GPU x utilisation - weights -
what vLLM's profiler measures). The count is the big matrices only: attention (MLA's low-rank
projections for DeepSeek), the MLP or the experts (DeepSeek's first dense layers apart), the
router and the embeddings; norms, biases, vision towers and Mamba mixers are left out, so it
is an estimate, labelled as one wherever it is printed.

Quantised checkpoints say so in `quantization_config`:
- "fp8" (DeepSeek V3's e4m3 with 128 x 128 blocks): every linear layer 1 byte per parameter
  plus one float32 scale per block; embeddings, the output head and the router stay in the
  model dtype (vLLM's `Fp8Config` quantises linear layers only).
- "mxfp4" (gpt-oss): the experts 4 bits per parameter plus one 8-bit scale per 32 (4.25 bits);
  everything in `modules_to_not_convert` (attention, router, embeddings, head) stays in the
  model dtype, as vLLM's `Mxfp4Config` quantises only the fused MoE layers.
- a `bits` field (GPTQ, AWQ): linear layers at that many bits plus a 16-bit scale per group.
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import DTYPE_SIZES
from refimpl.models.config import HFConfig

#: MXFP4: 32 four-bit values share one 8-bit (E8M0) scale: (32 x 4 + 8) / 32 bits each.
MXFP4_BITS_PER_PARAM = 4.25


@dataclass(frozen=True)
class WeightCount:
    """Parameters of a model by where quantisation applies."""

    attention: int  # attention projections of every layer
    mlp: int  # dense MLPs (every layer of a dense model, DeepSeek's first layers)
    experts: int  # routed and shared experts
    router: int  # the experts' gate
    embeddings: int  # input embeddings and the output head

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.experts + self.router + self.embeddings


def count_parameters(cfg: HFConfig) -> WeightCount:
    """The big matrices' parameters, from the config's sizes."""
    get = cfg.get_int  # absent keys count as 0; an explicit 0 only where 0 means "none"
    hidden = get("hidden_size", 0)
    layers = get("num_hidden_layers", 0)
    heads = get("num_attention_heads", 1)
    vocab = get("vocab_size", 0)
    if cfg.get("kv_lora_rank") is not None:  # MLA (DeepSeek V2/V3): a latent KV
        nope, rope = get("qk_nope_head_dim"), get("qk_rope_head_dim")
        v_dim, kv_rank = get("v_head_dim"), get("kv_lora_rank")
        q_rank = get("q_lora_rank", 0, minimum=0)  # 0 or absent: full-rank queries
        q = (
            hidden * q_rank + q_rank * heads * (nope + rope)
            if q_rank
            else hidden * heads * (nope + rope)
        )
        attention = (
            q
            + hidden * (kv_rank + rope)
            + kv_rank * heads * (nope + v_dim)
            + heads * v_dim * hidden
        )
    else:
        head_dim = get("head_dim", hidden // heads)
        kv_heads = get("num_key_value_heads", heads)
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    experts = next(
        (
            get(key, minimum=0)
            for key in ("num_local_experts", "n_routed_experts", "num_experts")
            if cfg.get(key) is not None
        ),
        0,
    )
    inter = get("intermediate_size", 0)
    moe_inter = get("moe_intermediate_size", inter)
    if experts:
        dense_layers = get("first_k_dense_replace", 0, minimum=0)
        moe_layers = layers - dense_layers
        shared_key = next(
            (
                k
                for k in ("shared_expert_intermediate_size", "shared_intermediate_size")
                if cfg.get(k) is not None
            ),
            None,
        )
        shared = get("n_shared_experts", 0, minimum=0) * moe_inter + (
            get(shared_key, minimum=0) if shared_key else 0
        )
        mlp = dense_layers * 3 * hidden * inter
        expert_params = moe_layers * 3 * hidden * (experts * moe_inter + shared)
        router = moe_layers * hidden * experts
    else:
        mlp, expert_params, router = layers * 3 * hidden * inter, 0, 0
    embeddings = vocab * hidden * (1 if cfg.get_bool("tie_word_embeddings") else 2)
    return WeightCount(layers * attention, mlp, expert_params, router, embeddings)


def quantization_config(cfg: HFConfig) -> dict | None:
    """The checkpoint's `quantization_config` (top level or the text model's), if any."""
    for where in (cfg.raw, cfg.text):
        found = where.get("quantization_config")
        if isinstance(found, dict):
            return found
    return None


def describe_quantization(cfg: HFConfig) -> str | None:
    """A few words on how the estimate counted a quantised checkpoint, or None."""
    quant = quantization_config(cfg)
    if quant is None:
        return None
    method = str(quant.get("quant_method", "?")).lower()
    if method == "fp8":
        block = quant.get("weight_block_size")
        scales = f", a scale per {block[0]}x{block[1]} block" if block else ""
        return f"fp8 linear layers (1 B per parameter{scales})"
    if method == "mxfp4":
        return f"mxfp4 experts ({MXFP4_BITS_PER_PARAM} bits per parameter, scales included)"
    if quant.get("bits"):
        return f"{method} {quant['bits']}-bit linear layers"
    return f"{method}: not understood, counted in the model dtype"


def estimate_weight_bytes(cfg: HFConfig, model_dtype: str, tensor_parallel_size: int) -> int:
    """Bytes of weights one of `tensor_parallel_size` GPUs holds: an estimate (see the module
    docstring for what is counted and how quantised layers are)."""
    count = count_parameters(cfg)
    size = DTYPE_SIZES[model_dtype]
    quant = quantization_config(cfg) or {}
    method = str(quant.get("quant_method", "")).lower()
    linear = count.attention + count.mlp + count.experts
    unquantised = count.embeddings + count.router
    if method == "fp8":
        block = quant.get("weight_block_size") or [128, 128]
        scales = 4 * -(-linear // (int(block[0]) * int(block[1])))
        total = linear + scales + unquantised * size
    elif method == "mxfp4":
        total = (
            int(count.experts * MXFP4_BITS_PER_PARAM / 8)
            + (count.attention + count.mlp + unquantised) * size
        )
    elif quant.get("bits"):
        group = int(quant.get("group_size") or 128)  # -1: one scale per output channel
        scales = 2 * linear // group if group > 0 else 0
        total = linear * int(quant["bits"]) // 8 + scales + unquantised * size
    else:
        total = count.total * size
    return total // tensor_parallel_size
