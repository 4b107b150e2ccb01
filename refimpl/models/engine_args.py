"""The `vllm serve` settings a KV cache plan depends on, resolved ONCE as vLLM 0.32 does.

`EngineArgs` holds what the user typed (vLLM's flag names, None where nothing was given);
`EngineArgs.create_engine_config()` resolves it into one `ServeConfig`, as vLLM's `EngineArgs`
-> `VllmConfig` does, and everything after it (the specs, the plan, the printed lines) reads
that object only. vLLM fills what the user leaves out in three places, in this order:
`EngineArgs` picks the batch defaults for the device (`get_batch_defaults`,
`_set_default_max_num_seqs_and_batched_tokens_args`), `VllmConfig` turns async scheduling on
unless something forbids it, and then the platform's `check_and_update_config` has the last
word: vLLM's CPU platform switches async scheduling off, and for an MLA model (without AMX
tiles) also chunked prefill, raising the batched tokens to at least the model length.
`ModelConfig` refuses a `--max-model-len` above what the config allows
(`_get_and_verify_max_len`). The flag syntax is vLLM's (`human_readable_int`).
`tests/data/vllm_serve_defaults_oracle.json` holds what vLLM's own code answers for these.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from refimpl.models.config import HFConfig
from refimpl.models.speculative import resolve_speculative_config

GIB = 1 << 30
#: `SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS`: what the CPU MLA path raises from.
SCHEDULER_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
#: The GPU `plan` assumes when no memory flag says otherwise (see `refimpl.models.gpus`).
ASSUMED_GPU_NAME = "NVIDIA H100 80GB HBM3"
#: The environment variable vLLM reads to allow a --max-model-len above the config's.
ALLOW_LONG_MAX_MODEL_LEN = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
#: `vllm serve`'s default share of the GPU (vLLM 0.32 CacheConfig).
GPU_MEMORY_UTILIZATION = 0.9

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


# --- flag syntax (vLLM's argparse_utils)


def human_readable_int(value: str) -> int:
    """vLLM's integer flags: '8k' = 8,000 and '8K' = 8,192 (lower case decimal, upper case
    binary), '25.6k' = 25,600 (a decimal number only with a decimal suffix), else a plain
    integer."""
    value = value.strip()
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if found:
        number, suffix = found.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(
                f"decimals are not allowed with binary suffixes like {suffix}; did you mean "
                f"{number}{suffix.lower()}?"
            )
        return int(number) * _BINARY[suffix]
    try:
        return int(value)
    except ValueError:
        raise ValueError(
            f"expected a whole number such as 8192, 8k (8,000) or 8K (8,192), got {value!r}"
        ) from None


def human_readable_int_or_auto(value: str) -> int:
    """`--max-model-len`: as `human_readable_int`, and '-1' or 'auto' give -1 (fit the
    longest length the KV cache budget holds)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def argparse_type(parse, minimum: int, what: str):
    """An argparse type from `human_readable_int` or `human_readable_int_or_auto`, with a
    lower bound (-1 passes where 'auto' is meant)."""

    def parse_flag(text: str) -> int:
        try:
            value = parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value == -1 and parse is human_readable_int_or_auto:
            return value
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"must be at least {minimum} ({what}), got {value}"
            )
        return value

    return parse_flag


# --- batch defaults (EngineArgs.get_batch_defaults, for `vllm serve`)


def get_batch_defaults(
    world_size: int, *, platform: str, device_memory: int, device_name: str
) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) `vllm serve` starts from on this device.

    CUDA: 16,384 / 1,024 from 160 GiB of device memory (B200, B300); 8,192 / 1,024 from
    70 GiB unless the device is an A100 (H100, H200); else 2,048 / 256. The CPU platform:
    2,048 / 128 per rank (x world size).
    """
    if platform == "cpu":
        return 2048 * world_size, 128 * world_size
    if device_memory >= 160 * GIB:
        return 16384, 1024
    if device_memory >= 70 * GIB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


@dataclass
class SchedulerSettings:
    """What the scheduler runs with, and why (`notes`, for the plan's "why" list)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    async_scheduling: bool
    enable_chunked_prefill: bool
    notes: list[str] = field(default_factory=list)


def resolve_scheduler_settings(
    *,
    platform: str,
    max_model_len: int,
    use_mla: bool,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    async_scheduling: bool | None = None,
    enable_chunked_prefill: bool | None = None,
    device_memory: int | None = None,
    device_name: str | None = None,
) -> SchedulerSettings:
    """The scheduler settings `vllm serve` ends with: the user's values, else the device's
    defaults (`_set_default_max_num_seqs_and_batched_tokens_args`, for a world of TP x PP
    ranks), then what the platform forces (`CpuPlatform.check_and_update_config`) and what
    `SchedulerConfig.verify_max_model_len` refuses. `max_model_len` is the length the
    ModelConfig settled (the derived one when the user asked for auto-fit). No device given:
    the default GPU (`gpus.DEFAULT_GPU`)."""
    from refimpl.models.gpus import DEFAULT_GPU

    notes: list[str] = []
    memory = DEFAULT_GPU.total_memory if device_memory is None else device_memory
    name = DEFAULT_GPU.name if device_name is None else device_name
    world_size = tensor_parallel_size * pipeline_parallel_size
    batched, seqs = get_batch_defaults(
        world_size, platform=platform, device_memory=memory, device_name=name
    )
    # every generative decoder model supports chunked prefill; vLLM turns it on by default
    chunked_prefill = True if enable_chunked_prefill is None else enable_chunked_prefill
    if max_num_batched_tokens is None:
        if not chunked_prefill:  # a whole prompt must fit in one step
            batched = max(max_model_len, batched)
        # vLLM caps a default at max_num_seqs x max_model_len (a tiny context gets less)
        batched = min((max_num_seqs or seqs) * max_model_len, batched)
        if platform == "cpu":
            why = f"vLLM's CPU platform (2,048 per rank x {world_size} ranks)"
        else:
            named = device_name or (name if device_memory is None else None)
            why = f"a GPU of {memory / GIB:.2f} GiB" + (f" ({named})" if named else "")
        notes.append(f"--max-num-batched-tokens {batched:,}: vllm serve's default on {why}")
    else:
        batched = max_num_batched_tokens
    seqs = min(seqs, batched) if max_num_seqs is None else max_num_seqs
    asynchronous = True if async_scheduling is None else async_scheduling
    if platform == "cpu":
        if async_scheduling is not False:
            notes.append(
                "vLLM's CPU platform turns async scheduling off (one batch in flight)"
            )
        asynchronous = False
        if use_mla:
            chunked_prefill = False
            raised = max(max_model_len, SCHEDULER_DEFAULT_MAX_NUM_BATCHED_TOKENS)
            if raised != batched:
                notes.append(
                    f"MLA on vLLM's CPU platform disables chunked prefill and sets "
                    f"--max-num-batched-tokens to max(max model len, 2,048) = {raised:,}"
                )
            batched = raised
    if batched < max_model_len and not chunked_prefill:
        raise ValueError(
            f"--max-num-batched-tokens {batched:,} is smaller than --max-model-len "
            f"{max_model_len:,}, and without chunked prefill a prompt must fit in one step; "
            "raise --max-num-batched-tokens or give --enable-chunked-prefill"
        )
    if batched < seqs:
        raise ValueError(
            f"--max-num-batched-tokens {batched:,} must be at least --max-num-seqs {seqs:,}; "
            "raise --max-num-batched-tokens or lower --max-num-seqs"
        )
    return SchedulerSettings(batched, seqs, asynchronous, chunked_prefill, notes)


# --- the model length (ModelConfig's _get_and_verify_max_len)


def allow_long_max_model_len() -> bool:
    """vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN`: "1" or "true" (any case) allows it."""
    return os.environ.get(ALLOW_LONG_MAX_MODEL_LEN, "0").strip().lower() in ("1", "true")


def verify_max_model_len(
    max_model_len: int | None, derived: int, model_max_length: int | None = None
) -> tuple[int, list[str]]:
    """The length vLLM's ModelConfig settles on: the config's (`derived`) when none or -1 is
    given, the user's when it is no longer; a longer one is refused unless the config's
    `model_max_length` allows it or VLLM_ALLOW_LONG_MAX_MODEL_LEN is set."""
    if max_model_len is None or max_model_len == -1:
        return derived, []
    if max_model_len > derived and (
        model_max_length is None or max_model_len > model_max_length
    ):
        if not allow_long_max_model_len():
            raise ValueError(
                f"--max-model-len {max_model_len:,} is greater than the length the config "
                f"allows ({derived:,}); vLLM refuses it unless the environment variable "
                f"{ALLOW_LONG_MAX_MODEL_LEN}=1 is set (positions past the trained length "
                "give NaNs with RoPE, or out-of-bounds reads with absolute positions)"
            )
        return max_model_len, [
            f"--max-model-len {max_model_len:,} exceeds the config's {derived:,}, allowed by "
            f"{ALLOW_LONG_MAX_MODEL_LEN}"
        ]
    return max_model_len, []


# --- the settings object (EngineArgs -> VllmConfig)

#: Model configs that ship with the package, by the name `--config` also takes.
PACKAGED_CONFIGS = Path(__file__).parent / "configs"


def find_config(config: str | Path | dict | HFConfig) -> HFConfig:
    """A config.json by path (the file or its directory) or by the name of one that ships
    with the package (`deepseek-v4-pro`, `deepseek-v4-flash`)."""
    if isinstance(config, HFConfig):
        return config
    if isinstance(config, (str, Path)) and not Path(config).exists():
        packaged = PACKAGED_CONFIGS / str(config) / "config.json"
        if packaged.is_file():
            return HFConfig.load(packaged)
        raise ValueError(
            f"no config.json at {str(config)!r}: give a local file or its directory, or a "
            f"packaged config ({', '.join(packaged_config_names())})"
        )
    return HFConfig.load(config)


def packaged_config_names() -> list[str]:
    return sorted(p.name for p in PACKAGED_CONFIGS.iterdir() if (p / "config.json").is_file())


@dataclass(frozen=True)
class KVBudget:
    """The bytes the KV cache gets on one GPU, and where the figure came from.

    Exact when `--kv-cache-memory-bytes` gave it. Otherwise an estimate from the GPU's memory
    (`gpu_memory` x `gpu_memory_utilization` - `weights_bytes`), printed as a range: from
    `no_overhead_bytes` (nothing else subtracted) down to `kv_cache_memory_bytes`, which also
    subtracts `allowance` (activations and CUDA graphs, `gpus.estimate_overhead`)."""

    kv_cache_memory_bytes: int
    is_estimate: bool = False
    gpu_name: str | None = None
    gpu_memory: int | None = None
    gpu_memory_utilization: float | None = None
    weights_bytes: int | None = None
    weights_is_estimate: bool = False
    weights_quantization: str | None = None
    allowance: Any = None  # gpus.OverheadAllowance for an estimate

    @property
    def no_overhead_bytes(self) -> int:
        if not self.is_estimate:
            return self.kv_cache_memory_bytes
        return int(self.gpu_memory * self.gpu_memory_utilization) - self.weights_bytes


@dataclass(frozen=True)
class ServeConfig:
    """`vllm serve`'s settings after vLLM resolved them (the KV-cache part of its VllmConfig),
    with the per-layer specs the workers report for them. Built once by
    `EngineArgs.create_engine_config`; the plan and the printed lines read only this."""

    engine_args: EngineArgs
    hf_config: HFConfig
    model: Any  # refimpl.models.ModelKVCacheSpecs
    max_model_len: int  # the verified length (the config's when auto-fit is asked)
    derived_max_model_len: int  # what the config allows (ModelConfig's derived length)
    auto_fit: bool
    scheduler: SchedulerSettings
    budget: KVBudget
    notes: tuple[str, ...] = ()
    pipeline_stages: tuple[tuple[str, ...], ...] | None = None  # layers per stage (PP > 1)
    speculative: Any = None  # speculative.SpeculativeConfig, for --speculative-config

    @property
    def use_eagle(self) -> bool:
        """Speculative decoding by an EAGLE-style drafter (EAGLE, EAGLE-3, MTP): its layers'
        group drops its last block on a prefix-cache hit (vLLM's `use_eagle`)."""
        return self.speculative is not None and self.speculative.use_eagle

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """vLLM's `num_prefill_lookahead_tokens` (0 without speculative decoding)."""
        return 0 if self.speculative is None else self.speculative.num_prefill_lookahead_tokens

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens the scheduler may have in flight: one batch, two with async scheduling."""
        return self.scheduler.max_num_batched_tokens * (
            2 if self.scheduler.async_scheduling else 1
        )


#: The environment variable vLLM reads for an uneven split of layers over pipeline stages.
PP_LAYER_PARTITION = "VLLM_PP_LAYER_PARTITION"


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """[start, end) of the decoder layers pipeline stage `pp_rank` holds, as vLLM splits
    them: evenly, the remainder going one each to the stages before the last (the last holds
    the output norm and head), or as VLLM_PP_LAYER_PARTITION lists them."""
    listed = os.environ.get(PP_LAYER_PARTITION)
    if listed is not None:
        try:
            partitions = [int(n) for n in listed.split(",")]
        except ValueError:
            raise ValueError(
                f"{PP_LAYER_PARTITION}={listed!r} is not a list of counts"
            ) from None
        if len(partitions) != pp_size or sum(partitions) != num_hidden_layers:
            raise ValueError(
                f"{PP_LAYER_PARTITION}={listed!r} must list {pp_size} counts summing to "
                f"{num_hidden_layers} layers"
            )
    else:
        partitions = [num_hidden_layers // pp_size] * pp_size
        for i in range(2, num_hidden_layers % pp_size + 2):
            partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def layer_index(name: str) -> int:
    """The decoder layer a cache layer belongs to: the one whole number in its name
    (vLLM's `extract_layer_index`)."""
    numbers = [int(part) for part in name.split(".") if part.isdigit()]
    if len(numbers) != 1:
        raise ValueError(f"cannot tell which decoder layer {name!r} belongs to")
    return numbers[0]


def pipeline_stages(specs, num_hidden_layers: int, pp_size: int) -> list[list[str]]:
    """The cache layers each pipeline stage holds, in registration order."""
    if pp_size > num_hidden_layers:
        raise ValueError(
            f"--pipeline-parallel-size {pp_size} is more than the {num_hidden_layers} decoder "
            "layers"
        )
    bounds = [get_pp_indices(num_hidden_layers, rank, pp_size) for rank in range(pp_size)]
    return [[n for n in specs if lo <= layer_index(n) < hi] for lo, hi in bounds]


@dataclass(frozen=True)
class EngineArgs:
    """What the user typed, in `vllm serve`'s names (None: not given, vLLM's default applies).

    `model`: a config.json path, its directory, a parsed dict or a packaged config's name.
    `gpu_memory`, `gpu_name`, `weights_memory` and `cpu_isa` are refimpl's own: the device
    vLLM would measure or probe at startup, for planning before there is one.
    `attention_backend` is vLLM's `--attention-backend` (refimpl's lower-case names,
    `backends.BACKENDS`)."""

    model: str | Path | dict | HFConfig
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: str | None = None
    block_size: int | None = None
    max_model_len: int | None = None  # -1: auto-fit
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    async_scheduling: bool | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    disable_hybrid_kv_cache_manager: bool = False
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    attention_backend: str | None = None
    speculative_config: dict | None = None
    cpu_isa: str | None = None  # vLLM's CPU platform: which CPU (None / "auto": this host)
    gpu_memory: int | None = None
    gpu_name: str | None = None
    weights_memory: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "decode_context_parallel_size",
        ):
            _check_int(name, getattr(self, name), 1)
        for name, low in (
            ("block_size", 1),
            ("max_num_batched_tokens", 1),
            ("max_num_seqs", 1),
            ("num_gpu_blocks_override", 2),
            ("kv_cache_memory_bytes", 1),
            ("gpu_memory", 1),
            ("weights_memory", 0),
        ):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), low)
        if self.max_model_len is not None and self.max_model_len != -1:
            _check_int("max_model_len", self.max_model_len, 1)
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {u!r}")
        if self.mamba_cache_mode not in (None, "align", "none"):
            raise ValueError(
                f"mamba_cache_mode must be 'align' or 'none', got {self.mamba_cache_mode!r}"
            )
        if self.speculative_config is not None and not isinstance(
            self.speculative_config, dict
        ):
            raise ValueError(
                f"speculative_config must be a JSON object, got {self.speculative_config!r}"
            )

    def create_engine_config(self) -> ServeConfig:
        """Resolve every setting once, in vLLM's order: the config and its length
        (`ModelConfig`), the specs the workers build, the scheduler for the backend's platform
        and the device, then the budget (exact, or estimated from the GPU's memory)."""
        from refimpl.models import get_kv_cache_spec, resolve_config

        cfg = resolve_config(find_config(self.model))
        derived = cfg.derived_max_model_len()
        auto_fit = self.max_model_len == -1
        max_len, notes = verify_max_model_len(
            self.max_model_len, derived, cfg.get("model_max_length")
        )
        # vLLM 0.32 derives the Mamba cache mode from prefix caching (MambaModelConfig:
        # "align" when on, "none" when off), whatever --mamba-cache-mode says
        prefix_caching = self.enable_prefix_caching
        speculative = None
        if self.speculative_config is not None:
            speculative = resolve_speculative_config(self.speculative_config, cfg)
        model = get_kv_cache_spec(
            cfg,
            num_mtp_layers=speculative.num_mtp_layers if speculative else 0,
            num_speculative_tokens=speculative.num_speculative_tokens if speculative else 0,
            tensor_parallel_size=self.tensor_parallel_size,
            kv_cache_dtype=self.kv_cache_dtype,
            backend=self.attention_backend,
            block_size=self.block_size,
            max_model_len=max_len,
            dtype=self.dtype,
            enable_prefix_caching=prefix_caching,
            cpu_isa=self.cpu_isa,
            mamba_ssm_cache_dtype=self.mamba_ssm_cache_dtype,
        )
        if speculative is not None and speculative.draft is not None:
            model = self._with_draft_layers(cfg, model, speculative, prefix_caching, max_len)
        if self.decode_context_parallel_size > 1:
            model = self._with_decode_context_parallel(cfg, model)
        device_name, device_memory = self._device()
        scheduler = resolve_scheduler_settings(
            platform=model.backend.platform,
            max_model_len=max_len,
            use_mla=model.backend.is_mla and not self._amx_runs_mla(cfg, model),
            tensor_parallel_size=self.tensor_parallel_size,
            pipeline_parallel_size=self.pipeline_parallel_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            async_scheduling=self.async_scheduling,
            enable_chunked_prefill=self.enable_chunked_prefill,
            device_memory=device_memory,
            device_name=device_name,
        )
        budget = self._budget(cfg, model, scheduler, device_name, device_memory)
        stages = None
        if self.pipeline_parallel_size > 1:
            stages = tuple(
                tuple(names)
                for names in pipeline_stages(
                    model.specs,
                    int(cfg.require("num_hidden_layers")),
                    self.pipeline_parallel_size,
                )
            )
        return ServeConfig(
            engine_args=self,
            hf_config=cfg,
            model=model,
            max_model_len=max_len,
            derived_max_model_len=derived,
            auto_fit=auto_fit,
            scheduler=scheduler,
            budget=budget,
            notes=tuple(notes),
            pipeline_stages=stages,
            speculative=speculative,
        )

    def _with_draft_layers(self, cfg: HFConfig, model, speculative, prefix_caching, max_len):
        """The target's specs followed by the drafter's, which vLLM's model runner reports
        with them: built from the draft's config with the target's dtype, cache dtype,
        backend, block size and tensor parallelism, named as vLLM's drafter classes name
        them (`speculative.draft_layer_name`)."""
        from dataclasses import replace

        from refimpl.models import get_kv_cache_spec
        from refimpl.models.speculative import draft_layer_name, eagle_head_config

        if self.pipeline_parallel_size > 1:
            raise ValueError(
                "a drafter's layers with --pipeline-parallel-size above 1 are not planned"
            )
        draft = speculative.draft
        if speculative.method in ("eagle", "eagle3"):
            draft = eagle_head_config(draft)
        drafted = get_kv_cache_spec(
            draft,
            tensor_parallel_size=self.tensor_parallel_size,
            kv_cache_dtype=self.kv_cache_dtype,
            backend=self.attention_backend,
            block_size=model.block_size,
            max_model_len=max_len,
            dtype=model.model_dtype,
            enable_prefix_caching=True if prefix_caching is None else prefix_caching,
            cpu_isa=self.cpu_isa,
            num_speculative_tokens=speculative.num_speculative_tokens,
        )
        if drafted.block_size != model.block_size:
            raise ValueError(
                f"the drafter's layers settle on {drafted.block_size}-token blocks and the "
                f"target's on {model.block_size}; vLLM plans one block size for both"
            )
        target_layers = int(cfg.require("num_hidden_layers"))
        specs = dict(model.specs)
        for name, spec in drafted.specs.items():
            specs[draft_layer_name(speculative.method, target_layers, name)] = spec
        return replace(
            model,
            specs=specs,
            notes=[
                *model.notes,
                f"{len(drafted.specs)} cache layer{'s' * (len(drafted.specs) != 1)} of the "
                f"{speculative.method} drafter "
                f"({draft.source}) planned with the target's",
            ],
        )

    def _with_decode_context_parallel(self, cfg: HFConfig, model):
        """The specs with their tokens spread over the DCP ranks (`context_parallel`)."""
        from dataclasses import replace

        from refimpl.models.context_parallel import (
            check_decode_context_parallel,
            shard_over_decode_context,
        )

        dcp = self.decode_context_parallel_size
        check_decode_context_parallel(
            cfg,
            use_mla=model.backend.is_mla,
            tensor_parallel_size=self.tensor_parallel_size,
            dcp=dcp,
        )
        specs = shard_over_decode_context(model.specs, dcp, model.backend.name)
        return replace(
            model,
            specs=specs,
            notes=[
                *model.notes,
                f"decode context parallelism over {dcp} ranks: each stores one token in "
                f"{dcp}, so a {model.block_size}-token block spans "
                f"{model.block_size * dcp:,} tokens of a request",
            ],
        )

    def _amx_runs_mla(self, cfg: HFConfig, model) -> bool:
        """vLLM's CPU platform keeps chunked prefill for MLA where its AMX kernels run it: the
        AMX MLA backend, and DeepSeek V4 on an AMX CPU."""
        from refimpl.models.cpu_platform import resolve_cpu_isa

        if model.backend.platform != "cpu":
            return False
        if cfg.text_model_type == "deepseek_v4":
            return resolve_cpu_isa(self.cpu_isa).amx_tile
        return model.backend.name == "AMX_MLA"

    def _device(self) -> tuple[str | None, int | None]:
        """(name, memory) of the GPU planned for: --gpu-memory as given, else the table's
        memory for --gpu-name, else the default GPU when no exact budget is given."""
        from refimpl.models.gpus import DEFAULT_GPU, find_gpu

        if self.gpu_memory is not None:
            return self.gpu_name, self.gpu_memory
        if self.gpu_name is not None:
            gpu = find_gpu(self.gpu_name)
            return gpu.name, gpu.total_memory
        if self.kv_cache_memory_bytes is None:
            return DEFAULT_GPU.name, DEFAULT_GPU.total_memory
        return None, None

    def _budget(self, cfg, model, scheduler, device_name, device_memory) -> KVBudget:
        from refimpl.hybrid.kv_cache_interface import DTYPE_SIZES
        from refimpl.models.gpus import estimate_overhead
        from refimpl.models.weights import describe_quantization, estimate_weight_bytes

        if self.kv_cache_memory_bytes is not None:
            return KVBudget(self.kv_cache_memory_bytes)
        weights = self.weights_memory
        if weights is None:
            if cfg.get("hidden_size") is None:
                raise ValueError(
                    f"{cfg.source} gives no hidden_size to estimate the weights from; "
                    "give --weights-memory or --kv-cache-memory-bytes"
                )
            weights = estimate_weight_bytes(cfg, model.model_dtype, self.tensor_parallel_size)
        allowance = estimate_overhead(
            cfg,
            dtype_size=DTYPE_SIZES[model.model_dtype],
            tensor_parallel_size=self.tensor_parallel_size,
            max_num_batched_tokens=scheduler.max_num_batched_tokens,
            max_num_seqs=scheduler.max_num_seqs,
        )
        requested = int(device_memory * self.gpu_memory_utilization)
        left = requested - weights - allowance.total
        if left <= 0:
            raise ValueError(
                f"--gpu-memory-utilization {self.gpu_memory_utilization} of "
                f"{device_memory:,} B ({device_memory / GIB:.2f} GiB) leaves nothing for "
                f"the KV cache after {weights:,} B of weights and an allowance of "
                f"{allowance.total:,} B for activations and CUDA graphs; raise "
                "--tensor-parallel-size or --gpu-memory-utilization, or use a larger GPU"
            )
        return KVBudget(
            kv_cache_memory_bytes=left,
            is_estimate=True,
            gpu_name=device_name,
            gpu_memory=device_memory,
            gpu_memory_utilization=self.gpu_memory_utilization,
            weights_bytes=weights,
            weights_is_estimate=self.weights_memory is None,
            weights_quantization=describe_quantization(cfg),
            allowance=allowance,
        )


def _check_int(name: str, value: Any, minimum: int) -> None:
    """A whole number (not a bool) >= minimum, else a one-line ValueError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum:,}, got {value:,}")


__all__ = [
    "EngineArgs",
    "KVBudget",
    "ServeConfig",
    "find_config",
    "resolve_scheduler_settings",
    "verify_max_model_len",
]
