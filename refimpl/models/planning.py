"""One model's KV cache plan, typed: `EngineArgs` -> `ServeConfig` -> specs -> `plan_kv_cache`.

    from refimpl.models import EngineArgs, plan_model
    plan = plan_model(EngineArgs("config.json", kv_cache_memory_bytes=20 << 30))
    plan.num_tokens, plan.max_concurrency    # vLLM's two startup figures
    plan.groups[0].blocks_per_request        # and the rows behind them

The settings are resolved once (`EngineArgs.create_engine_config`), the planner runs once on
them (`refimpl.hybrid.kv_cache_utils.plan_kv_cache`, which also does the auto-fit and vLLM's
memory check), and this module only reads their answers: `python -m refimpl plan` prints a
`ModelKVCachePlan`, chapter 14 and scripts use its fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from refimpl.hybrid.kv_cache_interface import KVCacheGroupSpec, unwrap_spec
from refimpl.hybrid.kv_cache_utils import KVCachePlan, plan_kv_cache
from refimpl.models.engine_args import EngineArgs, ServeConfig


@dataclass(frozen=True)
class GroupRow:
    """One KV cache group as the plan's table shows it."""

    kind: str  # the spec class of its layers (a member's, for a group of unlike layers)
    block_size: int
    num_layers: int
    page_size_bytes: int  # one layer's page
    padding_bytes: int  # bytes a block of this group pads its layers' pages by
    sliding_window: int | None
    blocks_per_request: int  # at max_model_len
    layer_names: tuple[str, ...]

    @classmethod
    def of(cls, group: KVCacheGroupSpec, blocks_per_request: int) -> GroupRow:
        spec = unwrap_spec(group)
        real = sum(group.layer_spec(n).real_page_size_bytes for n in group.layer_names)
        return cls(
            kind=type(spec).__name__,
            block_size=group.block_size,
            num_layers=len(group.layer_names),
            page_size_bytes=group.layer_spec(group.layer_names[0]).page_size_bytes,
            padding_bytes=group.width_bytes - real,
            sliding_window=getattr(spec, "sliding_window", None),
            blocks_per_request=blocks_per_request,
            layer_names=tuple(group.layer_names),
        )


@dataclass(frozen=True)
class ModelKVCachePlan:
    """The plan for one model under one `vllm serve` command: the resolved settings
    (`config`), the planner's answer (`kv`, a `KVCachePlan`) and its groups as rows. For a
    budget estimated from GPU memory, `no_overhead` is the plan with nothing but the weights
    subtracted: the top of the printed range (`kv` is the bottom)."""

    config: ServeConfig
    kv: KVCachePlan
    groups: tuple[GroupRow, ...]
    no_overhead: KVCachePlan | None = None

    # the figures vLLM prints at startup, read off the planner's answer
    @property
    def num_blocks(self) -> int:
        return self.kv.kv_cache_config.num_blocks

    @property
    def num_tokens(self) -> int:
        return self.kv.num_tokens

    @property
    def max_concurrency(self) -> float:
        return self.kv.max_concurrency

    @property
    def max_model_len(self) -> int:
        """The length planned for (after auto-fit when it was asked)."""
        return self.kv.max_model_len

    @property
    def blocks_per_request(self) -> int:
        return sum(self.kv.blocks_per_request)

    def to_dict(self) -> dict:
        """Plain data for `--json` (stable keys, numbers as numbers)."""
        c, m, s, b = self.config, self.config.model, self.config.scheduler, self.config.budget
        out = {
            "config": c.hf_config.source,
            "architecture": m.architecture,
            "num_cache_layers": len(m.specs),
            "model_dtype": m.model_dtype,
            "kv_cache_dtype": c.engine_args.kv_cache_dtype,
            "kv_dtype": m.kv_dtype,
            "tensor_parallel_size": m.tensor_parallel_size,
            "pipeline_parallel_size": c.engine_args.pipeline_parallel_size,
            "pipeline_stage_layers": [len(stage) for stage in c.pipeline_stages]
            if c.pipeline_stages
            else [len(m.specs)],
            "backend": m.backend.name,
            "platform": m.backend.platform,
            "block_size": m.block_size,
            "max_model_len": self.max_model_len,
            "max_model_len_requested": c.engine_args.max_model_len,
            "derived_max_model_len": c.derived_max_model_len,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "max_num_seqs": s.max_num_seqs,
            "async_scheduling": s.async_scheduling,
            "enable_chunked_prefill": s.enable_chunked_prefill,
            "max_in_flight_tokens": self.kv.max_in_flight_tokens,
            "disable_hybrid_kv_cache_manager": c.engine_args.disable_hybrid_kv_cache_manager,
            "num_gpu_blocks_override": c.engine_args.num_gpu_blocks_override,
            "available_memory": self.kv.available_memory,
            "available_memory_is_estimate": b.is_estimate,
            "gpu_name": b.gpu_name,
            "gpu_memory": b.gpu_memory,
            "weights_bytes": b.weights_bytes,
            "weights_is_estimate": b.weights_is_estimate,
            "weights_quantization": b.weights_quantization,
            "kv_cache_layout": self.kv.kv_cache_layout,
            "groups": [
                {**row.__dict__, "layer_names": list(row.layer_names)} for row in self.groups
            ],
            "bytes_per_block": self.kv.bytes_per_block,
            "num_blocks": self.num_blocks,
            "blocks_per_request": self.blocks_per_request,
            "num_padding_layers": self.kv.num_padding_layers,
            "kv_cache_size_tokens": self.num_tokens,
            "max_concurrency": self.max_concurrency,
            "notes": list(c.model.notes) + list(c.notes) + list(s.notes),
            "planner_notes": [note.text for note in self.kv.notes],
        }
        if b.is_estimate:
            a, top = b.allowance, self.no_overhead
            out["estimate"] = {
                "activation_bytes": a.activation_bytes,
                "logits_bytes": a.logits_bytes,
                "cudagraph_bytes": a.cudagraph_bytes,
                "no_overhead_memory": top.available_memory,
                "no_overhead_num_blocks": top.kv_cache_config.num_blocks,
                "no_overhead_kv_cache_size_tokens": top.num_tokens,
                "no_overhead_max_concurrency": top.max_concurrency,
            }
        return out


def _plan(config: ServeConfig, memory: int) -> KVCachePlan:
    args, model = config.engine_args, config.model
    return plan_kv_cache(
        model.specs,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.scheduler.max_num_batched_tokens,
        async_scheduling=config.scheduler.async_scheduling,
        kv_cache_memory_bytes=memory,
        kv_cache_layout=model.backend.layouts_first,
        auto_fit=config.auto_fit,
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        pipeline_stages=config.pipeline_stages,
        use_eagle=config.use_eagle,
    )


def plan_model(settings: EngineArgs | ServeConfig) -> ModelKVCachePlan:
    """The KV cache plan vLLM 0.32 makes for these serve settings (see the module doc)."""
    config = settings if isinstance(settings, ServeConfig) else settings.create_engine_config()
    kv = _plan(config, config.budget.kv_cache_memory_bytes)
    groups = tuple(
        GroupRow.of(g, n)
        for g, n in zip(kv.kv_cache_config.kv_cache_groups, kv.blocks_per_request, strict=True)
    )
    top = _plan(config, config.budget.no_overhead_bytes) if config.budget.is_estimate else None
    return ModelKVCachePlan(config, kv, groups, top)
