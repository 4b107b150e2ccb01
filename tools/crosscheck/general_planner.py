"""vLLM 0.32's general planner and capacity figures against refimpl: random layer mixes of
every spec kind (full attention with its own value head size, sliding window, chunked local,
MLA, Mamba / linear-attention state), head counts, head sizes, dtypes, block sizes, layouts,
budgets, max lengths and batch sizes.

A case is plain JSON (`random_case`), so vLLM's side (`general_vllm.py`, only inside
`.venv-vllm`) builds vLLM's own spec classes from the same numbers, and the recorded-oracle
test replays `plan_refimpl` without vLLM. Compared: every group (layers, spec kind, block size,
page), bytes per block, block count, every tensor (layers, offset, layer stride, block stride,
size), tokens and concurrency, or the refusal and the longest length vLLM suggests.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from refimpl.hybrid import kv_cache_utils
from refimpl.hybrid.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    WindowSizeMismatchError,
)
from refimpl.hybrid.kv_cache_planning import (
    SpecPromotionError,
    UnsplittableBucketError,
    align_hybrid_block_size,
)
from refimpl.hybrid.kv_cache_utils import (
    NotEnoughKVCacheMemoryError,
    format_gib,
    plan_kv_cache,
)

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}
LAYOUTS = ["LBNHC", "LBHNC", "BLHNC", "BLNHC"]
PATTERNS = [
    "dense",
    "sliding",
    "near-equal",
    "chunked",
    "mla",
    "mamba",
    "mamba",
    "mixed",
    "near-equal",
]


def random_case(seed: int) -> dict:
    """One JSON-friendly planner case."""
    rng = random.Random(seed)
    pattern = PATTERNS[seed % len(PATTERNS)] if seed < 64 else rng.choice(PATTERNS)
    n = rng.randrange(1, 41)
    heads = rng.choice([1, 2, 4, 8, 8, 16])
    head = rng.choice([64, 80, 128, 128, 256])
    dtype = rng.choice(["bfloat16", "bfloat16", "float16", "float32", "float8_e4m3fn"])

    def attention(kind: str) -> dict:
        layer = {"kind": kind, "heads": heads, "head_size": head, "dtype": dtype}
        if pattern == "mixed" and kind != "mla" and rng.random() < 0.5:
            layer["heads"] = rng.choice([1, 2, 4, 8])
        if kind == "full" and rng.random() < 0.15:
            layer["head_size_v"] = rng.choice([64, 128, 192])
        if kind == "sliding":
            layer["window"] = rng.choice([128, 512, 1024, 4096, rng.randrange(2, 9000)])
        if kind == "chunked":
            layer["chunk"] = rng.choice([2048, 8192, 1024])
        if kind == "mla":
            layer.update(heads=1, head_size=rng.choice([576, 656, 512]))
        return layer

    kinds = {
        "dense": ["full"],
        "sliding": ["full", "sliding"],
        "near-equal": ["full", "sliding"],
        "chunked": ["full", "chunked"],
        "mla": ["mla", "mla", "sliding"],
        "mamba": ["full", "mamba", "mamba", "sliding"],
        "mixed": ["full", "sliding", "chunked", "mla", "mamba"],
    }[pattern]
    layers = []
    every = rng.choice([2, 3, 4, 6])
    for i in range(n):
        kind = kinds[0] if (i % every == every - 1 or len(kinds) == 1) else rng.choice(kinds)
        layers.append({"kind": "mamba"} if kind == "mamba" else attention(kind))
    if pattern == "near-equal":  # gpt-oss-like: two kinds with counts within 1.7x
        a = rng.randrange(2, 20)
        b = max(1, int(a * rng.uniform(0.6, 1.7)))
        window = attention("sliding")  # one window, as such models have
        layers = [attention("full") for _ in range(a)] + [dict(window) for _ in range(b)]
        rng.shuffle(layers)
    if pattern == "mixed":  # several windows in one model
        for layer in layers:
            if layer["kind"] == "sliding" and rng.random() < 0.3:
                layer["window"] = rng.choice([256, 2048])
    if any(x["kind"] == "mamba" for x in layers):
        # Mamba hybrids have one attention shape; drop MLA and chunked layers
        layers = [
            {"kind": "full", "heads": heads, "head_size": head, "dtype": dtype}
            if x["kind"] in ("mla", "chunked")
            else ({**x, "heads": heads} if x["kind"] != "mamba" else x)
            for x in layers
        ]
    max_model_len = rng.choice(
        [1024, 2048, 4096, 8192, 32768, 131072, rng.randrange(64, 70000)]
    )
    case = {
        "layers": layers,
        "block_size": rng.choice([16, 16, 32, 64, 128]),
        "layout": rng.choice(LAYOUTS),
        "max_model_len": max_model_len,
        "max_num_batched_tokens": rng.choice([512, 2048, 4096, 8192, 16384]),
        "async_scheduling": rng.random() < 0.5,
        "disable_hybrid": rng.random() < 0.12,
        "kernel_block": rng.choice([None, None, None, 16, 32]),
    }
    if any(x["kind"] == "mamba" for x in layers):
        case["mamba"] = {
            "type": rng.choice(["mamba1", "mamba2", "short_conv", "linear", "gdn_attn"]),
            "conv": [rng.choice([2048, 4096, 6144, 8192]), rng.choice([3, 4])],
            "ssm": [rng.choice([16, 32, 48, 64, 128]), rng.choice([64, 128]), 128],
            "ssm_dtype": rng.choice(["bfloat16", "float32"]),
            "cache_mode": rng.choice(["none", "align"]),
            "min_kernel_block": rng.choice([16, 32, 64]),
        }
    if rng.random() < 0.25:
        sharing = kv_sharing_layers(rng, layers)
        if sharing:
            case["kv_sharing"] = sharing
    # the budget: mostly one to a few hundred requests (`_generous_request_bytes` errs high,
    # so these fit); one case in ten gets half a request and is refused
    one = _generous_request_bytes(case)
    scale = rng.choice(
        [0.5, 1.5, 2, 3, 5, 17.5, 250, 1.5 + rng.random() * 60, 1.5 + rng.random() * 200, 3]
    )
    case["memory"] = max(1, int(one * scale))
    return case


def kv_sharing_layers(rng: random.Random, layers: list[dict]) -> dict[str, str]:
    """Cross-layer KV sharing as Gemma 3n and YOCO-style models declare it: some of the last
    attention layers read the cache of an earlier layer of the same kind (vLLM's
    `validate_kv_sharing_target`: an earlier layer, the same attention type) and own none.
    Returns {layer name: target layer name}."""
    attention = [i for i, x in enumerate(layers) if x["kind"] != "mamba"]
    if len(attention) < 3:
        return {}
    tail = attention[len(attention) - rng.randrange(1, len(attention) // 2 + 1) :]
    owners = [i for i in attention if i not in tail]
    sharing = {}
    for i in tail:
        same = [j for j in owners if j < i and layers[j] == layers[i]]
        if same:
            j = rng.choice(same)
            sharing[layer_name(i, layers[i])] = layer_name(j, layers[j])
    return sharing


def layer_name(i: int, layer: dict) -> str:
    return f"layers.{i}.{layer['kind']}"


def _generous_request_bytes(case: dict) -> int:
    """More than one request at max_model_len costs: every attention layer at the widest
    page, whole blocks of the largest block size it may grow to, the Mamba states several
    times over. Only for picking budgets; the planners' own figures are what is compared."""
    layers = [x for x in case["layers"] if x["kind"] != "mamba"]
    per_token = max((_rough_layer_bytes(x) for x in layers), default=0)
    block = case["block_size"] * 8
    state = 0
    if "mamba" in case:
        m = case["mamba"]
        conv = m["conv"][0] * m["conv"][1] * 2
        ssm = m["ssm"][0] * m["ssm"][1] * m["ssm"][2] * DTYPE_BYTES[m["ssm_dtype"]]
        state = conv + ssm
        block = max(block, 2 * -(-state // max(per_token, 1)))
    tokens = case["max_model_len"] + 2 * block
    n_mamba = len(case["layers"]) - len(layers)
    return len(layers) * per_token * tokens + 4 * (n_mamba + len(layers)) * state


def _rough_layer_bytes(layer: dict) -> int:
    v = layer.get("head_size_v", layer["head_size"]) if layer["kind"] != "mla" else 0
    return layer["heads"] * (layer["head_size"] + v) * DTYPE_BYTES[layer["dtype"]]


def mamba_state(case: dict) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    m = case["mamba"]
    return (tuple(m["conv"]), tuple(m["ssm"])), ("bfloat16", m["ssm_dtype"])


def attention_page_1_token(case: dict) -> int:
    first = next(x for x in case["layers"] if x["kind"] != "mamba")
    return 2 * first["heads"] * first["head_size"] * DTYPE_BYTES[first["dtype"]]


def refimpl_specs(case: dict) -> dict:
    """{layer name: refimpl spec}, with the hybrid block-size alignment for Mamba cases."""
    block_size, padded = case["block_size"], None
    if "mamba" in case and any(x["kind"] != "mamba" for x in case["layers"]):
        shapes, dtypes = mamba_state(case)
        state = MambaSpec(block_size=1, shapes=shapes, dtypes=dtypes).page_size_bytes
        block_size, padded = align_hybrid_block_size(
            block_size=block_size,
            attn_page_size_1_token=attention_page_1_token(case),
            mamba_page_size=state,
            kernel_block_alignment=case["mamba"]["min_kernel_block"],
        )
    kernel = case["kernel_block"]
    specs = {}
    sharing = case.get("kv_sharing", {})
    for i, layer in enumerate(case["layers"]):
        kind = layer["kind"]
        name = f"layers.{i}.{kind}"
        if name in sharing:  # reads another layer's cache: no spec of its own
            continue
        if kind == "mamba":
            shapes, dtypes = mamba_state(case)
            mode = case["mamba"]["cache_mode"]
            specs[name] = MambaSpec(
                block_size=block_size if mode == "align" else case["max_model_len"],
                shapes=shapes,
                dtypes=dtypes,
                page_size_padded=padded,
                mamba_type=case["mamba"]["type"],
                mamba_cache_mode=mode,
            )
            continue
        common = dict(
            block_size=block_size,
            num_kv_heads=layer["heads"],
            head_size=layer["head_size"],
            dtype=layer["dtype"],
            kernel_block_size=kernel,
        )
        if kind == "full":
            specs[name] = FullAttentionSpec(
                **common, head_size_v=layer.get("head_size_v", layer["head_size"])
            )
        elif kind == "sliding":
            specs[name] = SlidingWindowSpec(**common, sliding_window=layer["window"])
        elif kind == "chunked":
            specs[name] = ChunkedLocalAttentionSpec(
                **common, attention_chunk_size=layer["chunk"]
            )
        else:
            specs[name] = MLAAttentionSpec(**common)
    return specs


def plan_refimpl(case: dict) -> dict:
    """refimpl's answer, in the shape `general_vllm.plan_vllm` gives vLLM's."""
    try:
        specs = refimpl_specs(case)
        plan = plan_kv_cache(
            specs,
            max_model_len=case["max_model_len"],
            max_num_batched_tokens=case["max_num_batched_tokens"],
            kv_cache_memory_bytes=case["memory"],
            async_scheduling=case["async_scheduling"],
            kv_cache_layout=case["layout"],
            disable_hybrid_kv_cache_manager=case["disable_hybrid"],
            shared_kv_cache_layers=case.get("kv_sharing"),
        )
    except NotEnoughKVCacheMemoryError as e:
        return memory_refusal(e)
    except (UnsplittableBucketError, WindowSizeMismatchError, SpecPromotionError) as e:
        return {"error": REFUSALS[type(e).__name__]}
    except ValueError as e:  # no counterpart in vLLM's messages: never equal to its answer
        return {"error": f"refused: {type(e).__name__}: {e}"}
    config = plan.kv_cache_config
    out = {
        "groups": [group_summary(g.layer_names, g.kv_cache_spec) for g in plan.groups],
        "bytes_per_block": plan.bytes_per_block,
        "num_blocks": config.num_blocks,
        "tensors": [
            [list(t.shared_by), t.offset, t.layer_stride, t.block_stride, t.size]
            for t in config.kv_cache_tensors
        ],
        "num_tokens": plan.num_tokens,
        "max_concurrency": plan.max_concurrency,
    }
    if case.get("kv_sharing"):
        out["layer_names"] = [list(names) for names in plan.layer_names]
    return out


#: The refusals both planners can give, by the name each side's reason gets (vLLM's side:
#: `general_vllm.refusal`, from its deterministic messages; refimpl's: its error classes).
REFUSALS = {
    "UnsplittableBucketError": "refused: unsplittable bucket",
    "WindowSizeMismatchError": "refused: one group, several window sizes",
    "SpecPromotionError": "refused: local layers cannot be promoted to one type",
}


def memory_refusal(e: NotEnoughKVCacheMemoryError) -> dict:
    """refimpl's memory refusal with the figures vLLM's message prints: the max length, the
    GiB needed and available (two decimals, as vLLM's `format_gib`), the longest that fits."""
    if e.needed_bytes is None:
        return {"error": "no memory for blocks"}
    return {
        "error": "not enough memory",
        "max_model_len": e.max_model_len,
        "needed_gib": format_gib(e.needed_bytes),
        "available_gib": format_gib(e.available_bytes),
        "estimated_max_len": e.estimated_max_model_len,
    }


def spec_kind(spec) -> str:
    """vLLM's class name of a group spec (a uniform-type group: its members' kinds)."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        kinds = sorted({type(s).__name__ for s in spec.kv_cache_specs.values()})
        return "UniformTypeKVCacheSpecs[" + ",".join(kinds) + "]"
    return type(spec).__name__


def group_summary(names, spec) -> list:
    return [list(names), spec_kind(spec), spec.block_size, spec.page_size_bytes]


def case_causes(case: dict, plan: dict) -> set[str]:
    """What one case exercised, for the report (read from the case and vLLM's answer)."""
    kinds = {x["kind"] for x in case["layers"]}
    found = {f"layout {case['layout']}", "kinds " + "+".join(sorted(kinds))}
    if "error" in plan:
        error = plan["error"]
        found.add(error if error.startswith("refused") else "refused: " + error)
        return found
    sizes = [len(g[0]) for g in plan["groups"]]
    if len(sizes) > 1 and max(sizes) != min(sizes):
        found.add("groups of unequal size (padding layers or packing)")
    if len({g[2] for g in plan["groups"]}) > 1:
        found.add("several block sizes")
    if any("UniformType" in g[1] for g in plan["groups"]):
        found.add("uniform-type group")
    if "mamba" in case:
        found.add(f"mamba {case['mamba']['type']} ({case['mamba']['cache_mode']})")
    if case["disable_hybrid"]:
        found.add("hybrid manager disabled")
    if case.get("kv_sharing"):
        found.add("cross-layer KV sharing")
    return found


def named_case(name: str) -> dict:
    """The issue's examples, as cases (vLLM's answers are recorded in the planner oracle)."""
    full = {"kind": "full", "heads": 8, "head_size": 128, "dtype": "bfloat16"}
    sliding = {**full, "kind": "sliding", "window": 4096}
    base = {
        "block_size": 16,
        "layout": "LBNHC",
        "max_model_len": 8192,
        "max_num_batched_tokens": 8192,
        "async_scheduling": True,
        "disable_hybrid": False,
        "kernel_block": None,
        "memory": 10 << 30,
    }
    if name == "10 full + 14 sliding":  # the 1.5 rule: groups [10, 14]
        return {**base, "layers": [full] * 10 + [sliding] * 14}
    if name == "8 full + 4 sliding KV heads":  # the layout gate: blocks [16, 32]
        return {**base, "layers": [full, {**sliding, "heads": 4}] * 12}
    if name == "8 full + 4 sliding KV heads, BLHNC":  # packed instead: both 16
        return {**base, "layout": "BLHNC", "layers": [full, {**sliding, "heads": 4}] * 12}
    if name == "gemma-3 at 8k":  # 5 sliding : 1 full; the window reserves more than 8k
        layers = [
            full if i % 6 == 5 else {**sliding, "window": 1024, "heads": 16} for i in range(62)
        ]
        layers = [{**x, "heads": 16} for x in layers]
        return {**base, "layers": layers, "max_num_batched_tokens": 8192}
    if name == "mamba2 hybrid, 400-token blocks":
        layers = [full if i % 10 == 9 else {"kind": "mamba"} for i in range(40)]
        return {
            **base,
            "layers": layers,
            "mamba": {
                "type": "mamba2",
                "conv": [6144, 3],
                "ssm": [48, 64, 128],
                "ssm_dtype": "float32",
                "cache_mode": "none",
                "min_kernel_block": 16,
            },
        }
    raise ValueError(f"unknown named case {name!r}")


NAMED_CASES = (
    "10 full + 14 sliding",
    "8 full + 4 sliding KV heads",
    "8 full + 4 sliding KV heads, BLHNC",
    "gemma-3 at 8k",
    "mamba2 hybrid, 400-token blocks",
)


RULES = (
    "1.5 group-size rule",
    "merge step",
    "layout gate",
    "page padding",
    "Mamba block alignment",
    "window reservation",
    "cross-layer KV sharing",
)


@contextmanager
def undo_rule(rule: str) -> Iterator[None]:
    """Undo one rule of vLLM 0.32's planner in refimpl for the duration (the crosscheck and
    the oracle replay must then disagree somewhere)."""
    from refimpl.hybrid import kv_cache_interface as I
    from refimpl.hybrid import kv_cache_planning as P
    from refimpl.hybrid import older_planners

    packed = P.get_packed_kv_cache_groups
    patches = {
        # back to 1.25
        "1.5 group-size rule": mock.patch.object(P, "GROUP_SIZE_RATIO", 1.25),
        # full-attention layers merge only when equal
        "merge step": mock.patch.object(
            I.FullAttentionSpec, "merge", classmethod(I.KVCacheSpec.merge.__func__)
        ),
        # pack different pages whatever the layout
        "layout gate": mock.patch.object(
            P, "get_packed_kv_cache_groups", lambda specs, layout=None: packed(specs, "BLHNC")
        ),
        # grow blocks only, never pad (planner B's rule)
        "page padding": mock.patch.object(
            P, "unify_kv_cache_spec_page_size", older_planners.unify_kv_cache_spec_page_size_b
        ),
        # keep the configured block, leave the state unpadded
        "Mamba block alignment": mock.patch(
            f"{__name__}.align_hybrid_block_size", lambda **kw: (kw["block_size"], None)
        ),
        # a window reserves its own length only (no tokens in flight, no extra block)
        "window reservation": mock.patch.object(
            I.SlidingWindowSpec,
            "max_admission_blocks_per_request",
            lambda self, in_flight, max_len: (
                -(-min(self.sliding_window, max_len) // self.block_size)
            ),
        ),
        # a layer that reads another's cache is not added to its target's group
        "cross-layer KV sharing": mock.patch.object(
            kv_cache_utils,
            "add_kv_sharing_layers_to_kv_cache_groups",
            lambda shared, groups: [tuple(g.layer_names) for g in groups],
        ),
    }
    with patches[rule]:
        yield
