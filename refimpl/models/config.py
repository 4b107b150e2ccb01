"""Reading a Hugging Face config.json the way vLLM's ModelConfig does, for the cache's needs.

Only a local file is read (nothing is downloaded). The numbers the KV cache depends on are the
text model's: a multimodal config such as Gemma 3's keeps them under `text_config` (vLLM's
`hf_text_config`). A key the file leaves out takes the default of transformers' config class,
which is what vLLM sees after transformers has loaded the file; each family module lists the
defaults it relies on.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refimpl.models import schema

#: kv cache dtypes vLLM accepts here -> the element dtype the cache stores (vLLM's
#: `STR_DTYPE_TO_TORCH_DTYPE`: every fp8 flavour is stored as uint8 bytes).
KV_CACHE_DTYPES: dict[str, str | None] = {
    "auto": None,
    "bfloat16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "float32": "float32",
    "float": "float32",
    "fp8": "uint8",
    "fp8_e4m3": "uint8",
    "fp8_e5m2": "uint8",
}
#: Model dtypes vLLM serves when the config says "auto"; float32 checkpoints are served in
#: bfloat16 (`_resolve_auto_dtype`: "Downcast for float32 models").
_MODEL_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "bfloat16"}
#: `HFConfig.get_int`'s marker for "no default: the key is required".
_REQUIRED: Any = object()
#: Keys vLLM reads a model's maximum length from (`derived_max_model_len_and_key`); the
#: smallest one present wins.
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: RoPE scalings whose factor does not stretch the maximum length (vLLM's list).
_ROPE_TYPES_WITHOUT_STRETCH = (
    "su",
    "longrope",
    "llama3",
    "yarn",
    "deepseek_yarn",
    "deepseek_llama_scaling",
)


@dataclass(frozen=True)
class HFConfig:
    """A config.json as read: the whole file and the text model's part of it."""

    raw: dict[str, Any]
    text: dict[str, Any]
    source: str = "<dict>"
    defaults: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, config: str | Path | dict) -> HFConfig:
        """From a path to config.json (or its directory) or from an already parsed dict."""
        if isinstance(config, dict):
            raw, source = config, "<dict>"
        else:
            path = Path(config)
            if path.is_dir():
                path = path / "config.json"
            if not path.is_file():
                raise ValueError(f"no config.json at {str(path)!r} (give a local file)")
            try:
                raw = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} is not valid JSON: {exc}") from None
            source = str(path)
        if not isinstance(raw, dict):
            raise ValueError("a config.json must hold a JSON object")
        text = raw.get("text_config") or raw
        if not isinstance(text, dict):
            raise ValueError(f"{source}: text_config must be a JSON object, got {text!r:.60}")
        return cls(raw, text, source)

    def with_defaults(self, defaults: dict[str, Any]) -> HFConfig:
        """The same config where keys it leaves out take these (transformers') defaults."""
        return HFConfig(self.raw, self.text, self.source, {**self.defaults, **defaults})

    def get(self, key: str, default: Any = None) -> Any:
        """A text-model key, then a top-level one, then the family default (as given: a
        number read this way is not checked; counts and sizes go through `get_int`)."""
        for where in (self.text, self.raw):
            if where.get(key) is not None:
                return where[key]
        return self.defaults.get(key, default)

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.source}: the {self.architecture} config has no {key!r}")
        return value

    def get_int(
        self,
        key: str,
        default: Any = _REQUIRED,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> Any:
        """An integer field, checked: an int (no bool, float or string) within the bounds of
        its kind (`schema.bound_for`: layers, heads, sizes, tokens), or `minimum`/`maximum`
        when given. A key that is absent or null takes the family default, then `default`
        (returned as given, so `default=None` reads an optional field); with neither, the
        config is refused. An explicit 0 is a value like any other: refused unless
        `minimum=0`, never replaced by a fallback."""
        value = self.get(key)
        if value is None:
            if default is _REQUIRED:
                return self.require(key)  # raises: the config has no such key
            return default
        return schema.check_config_int(
            key, value, minimum=minimum, maximum=maximum, source=self.source
        )

    def get_bool(self, key: str, default: bool = False) -> bool:
        """A true/false field (a string such as "false" is refused, not read as true)."""
        value = self.get(key)
        if value is None:
            return default
        return schema.check_config_bool(key, value, source=self.source)

    def get_layer_types(self, allowed: Collection[str], num_layers: int) -> list[str] | None:
        """`layer_types`, checked as transformers does (names from `allowed`, one per
        layer), or None when the config gives none."""
        value = self.get("layer_types")
        if value is None:
            return None
        return schema.check_layer_types(value, allowed, num_layers, source=self.source)

    def check_divides(
        self, divisor_key: str, divisor: int, dividend_what: str, dividend: int, rule: str
    ) -> None:
        """Refuse the config unless `divisor` divides `dividend` (a consistency rule that
        transformers' or vLLM's code applies; `rule` says whose and why)."""
        schema.check_divides(
            divisor_key, divisor, dividend_what, dividend, rule=rule, source=self.source
        )

    @property
    def architecture(self) -> str:
        archs = self.raw.get("architectures") or []
        if not archs:
            raise ValueError(f"{self.source}: the config names no 'architectures'")
        return archs[0]

    @property
    def model_type(self) -> str:
        return str(self.raw.get("model_type", "?"))

    @property
    def text_model_type(self) -> str:
        return str(self.text.get("model_type", self.model_type))

    @property
    def checkpoint_dtype(self) -> str:
        """The dtype the checkpoint was saved in (float32 when the file does not say)."""
        for where in (self.raw, self.text):
            for key in ("dtype", "torch_dtype"):
                if where.get(key):
                    return str(where[key]).removeprefix("torch.")
        return "float32"

    def model_dtype(self, dtype: str = "auto") -> str:
        """The dtype vLLM serves the model in: `--dtype`, or for "auto" the checkpoint's, with
        float32 checkpoints served in bfloat16."""
        name = self.checkpoint_dtype if dtype == "auto" else dtype
        if name not in _MODEL_DTYPES:
            raise ValueError(f"unsupported model dtype {name!r}; allowed: bfloat16, float16")
        return name if dtype != "auto" else _MODEL_DTYPES[name]

    def derived_max_model_len(self) -> int:
        """vLLM's default --max-model-len: the smallest length key, stretched by a RoPE
        scaling factor unless the scaling type keeps the length (or the model is Gemma 3)."""
        lengths = [
            self.get_int(k, None, maximum=schema.CONTEXT.maximum) for k in _MAX_LEN_KEYS
        ]
        lengths = [n for n in lengths if n is not None]
        length = min(lengths) if lengths else 2048
        rope = self.get("rope_scaling") or self.get("rope_parameters")
        if isinstance(rope, dict) and "gemma3" not in self.model_type:
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type not in ("default", *_ROPE_TYPES_WITHOUT_STRETCH):
                factor = rope.get("factor")
                if factor is not None:
                    factor = schema.check_config_number(
                        "rope_scaling.factor", factor, source=self.source
                    )
                    length *= factor
        return schema.check_config_int(
            "max_model_len (derived)",
            int(length),
            maximum=schema.CONTEXT.maximum,
            source=self.source,
        )


def kv_cache_element_dtype(kv_cache_dtype: str, model_dtype: str) -> str:
    """The element dtype of K/V rows: "auto" follows the model, every fp8 flavour is a byte."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"unsupported kv cache dtype {kv_cache_dtype!r}; allowed: "
            f"{', '.join(KV_CACHE_DTYPES)}"
        )
    return KV_CACHE_DTYPES[kv_cache_dtype] or model_dtype


def kv_heads_per_rank(total_kv_heads: int, tensor_parallel_size: int) -> int:
    """KV heads one tensor-parallel rank stores: divided when there are enough, else each rank
    keeps one replicated head (vLLM's `ModelConfig.get_num_kv_heads`)."""
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    if total_kv_heads >= tensor_parallel_size:
        if total_kv_heads % tensor_parallel_size:
            raise ValueError(
                f"{total_kv_heads} KV heads cannot be split over {tensor_parallel_size} "
                "tensor-parallel ranks (vLLM needs a divisor)"
            )
    elif tensor_parallel_size % total_kv_heads:
        raise ValueError(
            f"{tensor_parallel_size} tensor-parallel ranks cannot replicate "
            f"{total_kv_heads} KV heads evenly (vLLM needs a multiple)"
        )
    return max(1, total_kv_heads // tensor_parallel_size)
