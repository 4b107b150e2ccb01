"""refimpl's side of the registry sweep (`registry_sweep`), and the oracle's format.

The oracle keeps, per architecture, the config.json vLLM read (towers dropped) and what vLLM
answered: per backend the block sizes, the layer specs (each distinct spec once, then one
index per layer) and the plans; per TP size the KV heads per rank and Mamba state shapes.
`compare_entry` rebuilds the same figures with refimpl and lists every one that differs.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

ORACLE = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "vllm_registry_oracle.json.gz"
)


def compact_config(cfg: dict, drop: tuple[str, ...]) -> dict:
    """The config without the keys refimpl never reads (towers) or that repeat defaults of
    no meaning to the cache (None values)."""
    out = {}
    for key, value in cfg.items():
        if key in drop or value is None:
            continue
        out[key] = compact_config(value, drop) if isinstance(value, dict) else value
    return out


_PLAN_KEYS = ("memory", "max_model_len", "num_blocks", "tokens", "concurrency", "groups")


def _pack_backend(backend: dict, names: list[str], table: list) -> None:
    """Layers as indices into the entry's spec table (names kept once per entry), plans as
    rows of `_PLAN_KEYS` (a refusal as [memory, length, message])."""
    records = [{k: v for k, v in r.items() if v is not None} for _, r in backend["layers"]]
    for record in records:
        if record not in table:
            table.append(record)
    if [name for name, _ in backend["layers"]] == names:
        backend["layers"] = [table.index(r) for r in records]
    else:
        backend["layers"] = [[n, table.index(r)] for n, r in backend["layers"]]
    backend["plans"] = [
        [p["memory"], p["max_model_len"], p["refused"][:160]]
        if "refused" in p
        else [p[k] for k in _PLAN_KEYS]
        for p in backend["plans"]
    ]


def unpack(entry: dict) -> dict:
    """A packed oracle entry in the sweep's own shape (records resolved, plans as dicts)."""
    if "layer_names" not in entry:
        return entry
    out = {**entry, "backends": _unpack_backends(entry, entry["backends"])}
    if "backends" in entry.get("fp8", {}):
        out["fp8"] = {"backends": _unpack_backends(entry, entry["fp8"]["backends"])}
    out["cpu_isas"] = {
        isa: {"backends": _unpack_backends(entry, run["backends"])}
        if "backends" in run
        else run
        for isa, run in entry.get("cpu_isas", {}).items()
    }
    return out


def _runs(entry: dict) -> list[tuple[str, dict, str, str | None]]:
    """(label, backends, kv cache dtype, CPU kind or None for the recording host) of every
    recorded run of one architecture: the model dtype cache, the fp8 cache, other CPUs."""
    runs = [("auto", entry["backends"], "auto", None)]
    if "backends" in entry.get("fp8", {}):
        runs.append(("fp8", entry["fp8"]["backends"], "fp8", None))
    for isa, run in entry.get("cpu_isas", {}).items():
        if "backends" in run:
            runs.append((f"cpu {isa}", run["backends"], "auto", isa))
    return runs


def _unpack_backends(entry: dict, backends: dict) -> dict:
    table, names = entry["specs"], entry["layer_names"]
    out = {}
    for name, backend in backends.items():
        if "layers" not in backend:
            out[name] = backend
            continue
        layers = [
            [names[i], table[x]] if isinstance(x, int) else [x[0], table[x[1]]]
            for i, x in enumerate(backend["layers"])
        ]
        plans = [
            {"memory": p[0], "max_model_len": p[1], "refused": p[2]}
            if len(p) == 3
            else dict(zip(_PLAN_KEYS, p, strict=True))
            for p in backend["plans"]
        ]
        out[name] = {**backend, "layers": layers, "plans": plans}
    return out


def pack(entries: list[dict], vllm_version: str, registry_size: int) -> dict:
    """The oracle: the built architectures with their figures, the others with vLLM's error."""
    built, failed = [], []
    for entry in sorted(entries, key=lambda e: e["architecture"]):
        if entry["status"] != "built":
            failed.append(
                {k: entry.get(k) for k in ("architecture", "kind", "source", "error", "where")}
            )
            continue
        table: list = []
        entry = dict(entry)
        entry["layer_names"] = [n for n, _ in entry["backends"]["CPU_ATTN"]["layers"]]
        for run in _runs(entry):
            for backend in run[1].values():
                if "layers" in backend:
                    _pack_backend(backend, entry["layer_names"], table)
        entry["specs"] = table
        built.append(entry)
    return {
        "vllm_version": vllm_version,
        "registry_size": registry_size,
        "built": built,
        "not_built": failed,
    }


#: vLLM's backend enum names -> refimpl's --backend names
BACKEND_NAMES = {
    "CPU_ATTN": "cpu_attn",
    "FLASH_ATTN": "flash_attn",
    "FLASHINFER": "flashinfer",
    "TRITON_ATTN": "triton_attn",
    "FLASH_ATTN_MLA": "flash_attn_mla",
    "FLASHMLA": "flashmla",
    "TRITON_MLA": "triton_mla",
}
_FIELDS = (
    "type",
    "block_size",
    "num_kv_heads",
    "head_size",
    "head_size_v",
    "sliding_window",
    "attention_chunk_size",
    "dtype",
    "shapes",
    "dtypes",
    "mamba_type",
    "page_size_padded",
    "page_size_bytes",
)
_MAMBA_TYPES = {
    "MAMBA2": "mamba2",
    "GDN_ATTN": "gdn_attn",
    "MAMBA1": "mamba1",
    "SHORT_CONV": "short_conv",
}


def layer_index(name: str) -> int:
    """The decoder layer a cache layer belongs to: the first number in its name (vLLM's
    module paths differ by model; the index and the spec are what the plan depends on)."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    return -1


def _record(spec) -> dict:
    from tools.crosscheck.models_compare import spec_record

    out = spec_record(spec)
    out["attention_chunk_size"] = getattr(spec, "attention_chunk_size", None)
    return out


def _comparable(record: dict) -> str:
    keep = {k: record.get(k) for k in _FIELDS}
    if keep["mamba_type"] is not None:
        keep["mamba_type"] = _MAMBA_TYPES.get(keep["mamba_type"], keep["mamba_type"])
    if keep["type"] != "MambaSpec" and keep["head_size_v"] is None:
        keep["head_size_v"] = keep["head_size"]
    return json.dumps(keep, sort_keys=True)


def layers_of(backend: dict) -> list[tuple[int, str]]:
    """vLLM's recorded layers as sorted (layer index, comparable spec) pairs."""
    return sorted(
        (layer_index(name), _comparable(record)) for name, record in backend["layers"]
    )


def refimpl_model(
    entry: dict,
    backend: str,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    cpu_isa: str | None = None,
):
    from refimpl.models import get_kv_cache_spec

    return get_kv_cache_spec(
        entry["config"],
        backend=BACKEND_NAMES[backend],
        kv_cache_dtype=kv_cache_dtype,
        max_model_len=entry["max_model_len"],
        enable_prefix_caching=entry["enable_prefix_caching"],
        tensor_parallel_size=tensor_parallel_size,
        # the CPU platform plans for the CPU the case was recorded as (the recording host's
        # own unless another was asked for)
        cpu_isa=(cpu_isa or entry.get("cpu_isa")) if backend == "CPU_ATTN" else None,
    )


def refimpl_plan(specs, entry: dict, plan: dict) -> dict:
    """refimpl's planner for a `ModelKVCacheSpecs` at one recorded (budget, length), with the
    hybrid manager off where refimpl's rule says vLLM turns it off; or its refusal."""
    from refimpl.hybrid.kv_cache_utils import plan_kv_cache
    from refimpl.models import hybrid_kv_cache_manager_disabled

    disabled, _ = hybrid_kv_cache_manager_disabled(specs)
    try:
        # the recorded tokens in flight are vLLM's (batched x batches in flight): one batch
        result = plan_kv_cache(
            specs.specs,
            max_model_len=plan["max_model_len"],
            max_num_batched_tokens=entry["max_in_flight_tokens"],
            async_scheduling=False,
            kv_cache_memory_bytes=plan["memory"],
            disable_hybrid_kv_cache_manager=disabled,
        )
    except ValueError as exc:
        return {"refused": str(exc)}
    return {
        "num_blocks": result.num_blocks,
        "tokens": result.num_tokens,
        "concurrency": result.max_concurrency,
        "groups": [[g.block_size, len(g.layer_names)] for g in result.groups],
    }


def compare_entry(entry: dict) -> tuple[int, list[str]]:
    """(cases compared, differences) for one built architecture: every backend's block size,
    layer specs and plans, and the KV heads per rank at each TP size."""
    entry = unpack(entry)
    arch = entry["architecture"]
    cases, out = 0, []
    every = [
        (b, r, d, isa, label) for label, bs, d, isa in _runs(entry) for b, r in bs.items()
    ]
    for backend, theirs, dtype, isa, label in every:
        if "layers" not in theirs:
            continue
        where = f"{arch} {backend}" + ("" if label == "auto" else f" ({label})")
        cases += 1
        try:
            model = refimpl_model(entry, backend, kv_cache_dtype=dtype, cpu_isa=isa)
            from refimpl.models import hybrid_kv_cache_manager_disabled

            if hybrid_kv_cache_manager_disabled(model)[0] != entry["disable_hybrid"]:
                out.append(f"{where}: hybrid manager off in vLLM: {entry['disable_hybrid']}")
        except ValueError as exc:
            if theirs.get("supports_kv_cache_dtype", True):
                out.append(f"{where}: refimpl refuses: {exc}")
            continue
        if not theirs.get("supports_kv_cache_dtype", True):
            out.append(f"{where}: vLLM's backend class does not store {dtype}, refimpl plans")
            continue
        if model.block_size != theirs["block_size"]:
            out.append(
                f"{where}: block size vLLM {theirs['block_size']}, refimpl {model.block_size}"
            )
        mine = sorted(
            (layer_index(n), _comparable(_record(s))) for n, s in model.specs.items()
        )
        theirs_l = layers_of(theirs)
        if {i for i, _ in mine} != {i for i, _ in theirs_l}:
            # vLLM's module tree numbers this model's layers its own way (a parallel hybrid's
            # mixers, a shared block): the specs are compared as a multiset
            mine = sorted((-1, r) for _, r in mine)
            theirs_l = sorted((-1, r) for _, r in theirs_l)
        if mine != theirs_l:
            diff = next(
                (
                    f"layer {a[0]}: vLLM {a[1]} refimpl {b[1]}"
                    for a, b in zip(theirs_l, mine)
                    if a != b
                ),
                f"{len(theirs_l)} layers in vLLM, {len(mine)} in refimpl",
            )
            out.append(f"{where}: specs differ; {diff}")
            continue
        for plan in theirs["plans"]:
            cases += 1
            ours = refimpl_plan(model, entry, plan)
            at = f"{where} at {plan['memory'] >> 20} MiB, {plan['max_model_len']} tokens"
            if "refused" in plan or "refused" in ours:
                if ("refused" in plan) != ("refused" in ours):
                    out.append(
                        f"{at}: vLLM {plan.get('refused', 'plans')}; refimpl "
                        f"{ours.get('refused', 'plans')}"
                    )
                continue
            for key in ("num_blocks", "tokens"):
                if plan[key] != ours[key]:
                    out.append(f"{at}: {key} vLLM {plan[key]}, refimpl {ours[key]}")
            if abs(plan["concurrency"] - ours["concurrency"]) > 1e-9:
                out.append(
                    f"{at}: concurrency vLLM {plan['concurrency']}, refimpl "
                    f"{ours['concurrency']}"
                )
            if [g[1:] for g in plan["groups"]] != ours["groups"]:
                out.append(f"{at}: groups vLLM {plan['groups']}, refimpl {ours['groups']}")
    for tp, row in entry.get("tensor_parallel", {}).items():
        cases += 1
        try:
            model = refimpl_model(
                entry,
                "FLASH_ATTN" if "FLASH_ATTN" in entry["backends"] else "FLASH_ATTN_MLA",
                int(tp),
            )
        except ValueError as exc:
            if "refused" not in row:
                out.append(f"{arch} TP {tp}: refimpl refuses: {exc}")
            continue
        if "refused" in row:
            out.append(f"{arch} TP {tp}: vLLM refuses ({row['refused']}), refimpl plans")
            continue
        attention = [
            s.num_kv_heads
            for s in model.specs.values()
            if hasattr(s, "num_kv_heads") and type(s).__name__ != "MLAAttentionSpec"
        ]
        if attention and max(attention) != row["num_kv_heads"]:
            out.append(
                f"{arch} TP {tp}: KV heads per rank vLLM {row['num_kv_heads']}, "
                f"refimpl {max(attention)}"
            )
    return cases, out


def coverage(oracle: dict) -> list[dict]:
    """One row per registry entry: "equal" (refimpl plans it, every figure as vLLM's),
    "refused" (refimpl names the rule it lacks), "differs", or "not built" (vLLM itself could
    not build it from the sweep's config on the meta device; vLLM's error is kept)."""
    rows = []
    for entry in oracle["built"]:
        cases, diffs = compare_entry(entry)
        refusals = [d for d in diffs if ": refimpl refuses: " in d]
        if not diffs:
            status, detail = "equal", f"{cases} cases"
        elif refusals and len(refusals) == len(diffs):
            reason = refusals[0].split(": refimpl refuses: ", 1)[1]
            status, detail = "refused", reason.split("missing rule: ", 1)[-1]
        else:
            status, detail = "differs", diffs[0]
        rows.append(
            {
                "architecture": entry["architecture"],
                "kind": entry["kind"],
                "source": entry["source"],
                "status": status,
                "detail": detail,
                "cases": cases,
            }
        )
    for entry in oracle["not_built"]:
        rows.append(
            {
                "architecture": entry["architecture"],
                "kind": entry["kind"],
                "source": entry["source"],
                "status": "not built",
                "detail": entry["error"],
                "cases": 0,
            }
        )
    return sorted(rows, key=lambda r: r["architecture"])


def headline(rows: list[dict]) -> str:
    built = [r for r in rows if r["status"] != "not built"]
    equal = [r for r in built if r["status"] == "equal"]
    cases = sum(r["cases"] for r in equal)
    return (
        f"{len(equal)} of the {len(built)} architectures vLLM 0.32 builds on the meta device "
        f"are planned by refimpl and equal on every figure "
        f"({100 * len(equal) / len(built):.1f}%, {cases:,} cases); "
        f"{len(rows)} registry entries in all"
    )


TABLE = Path(__file__).resolve().parents[2] / "docs" / "model-coverage.md"


def write_table(oracle: dict, path: Path = TABLE) -> str:
    """docs/model-coverage.md: the measured coverage and one line per registry entry."""
    rows = coverage(oracle)
    lines = [
        "# Which vLLM architectures refimpl plans",
        "",
        "Generated by `python -m tools.crosscheck.registry_compare` from "
        "`tests/data/vllm_registry_oracle.json.gz` (the registry sweep against vLLM "
        f"{oracle['vllm_version']}, `tools/crosscheck/registry_sweep.py`). Do not edit.",
        "",
        f"**{headline(rows)}.**",
        "",
        "For each entry of vLLM's model registry (text generation and multimodal) the "
        "sweep wrote a config from the model type's config class with a real layer pattern, "
        "let vLLM build the model on the meta device and plan its KV cache on the CPU "
        "platform and with each CUDA attention backend at several budgets, lengths and "
        "tensor-parallel sizes; "
        "refimpl planned the same config. *equal*: every spec and planned figure agrees "
        "(the number of cases compared); *refused*: refimpl names the rule it lacks; "
        "*not built*: vLLM could not build the model from the sweep's config (its error is "
        "quoted). Most of those are the sweep's: its config class leaves out a field real "
        "checkpoints have, or the model is remote code with no config class here "
        "(`fallback:llama`); a few are vLLM's CPU build (sparse attention, some MoE "
        "activations, meta tensors read at build time). *config* names the class the "
        "sweep's config came from.",
        "",
        "| architecture | kind | config | refimpl | cases / reason |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        detail = r["detail"].replace("|", "\\|").replace("\n", " ")[:160]
        if r["status"] == "equal":
            detail = f"{r['cases']}"
        lines.append(
            f"| {r['architecture']} | {r['kind']} | {r['source']} | {r['status']} | {detail} |"
        )
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return headline(rows)


def load_oracle() -> dict:
    """The oracle, each built entry told the recording host's CPU (for its CPU cases)."""
    oracle = json.loads(gzip.decompress(ORACLE.read_bytes()))
    for entry in oracle["built"]:
        entry["cpu_isa"] = oracle["cpu_isa"]
    return oracle


def write_oracle(oracle: dict) -> None:
    """The oracle as gzip'd compact JSON (mtime 0: the same content gives the same bytes)."""
    text = json.dumps(oracle, separators=(",", ":"), sort_keys=True) + "\n"
    ORACLE.write_bytes(gzip.compress(text.encode(), mtime=0))


if __name__ == "__main__":
    print(write_table(load_oracle()))
