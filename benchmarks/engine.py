"""Benchmark: refimpl's LLM.generate next to transformers' generate, and prefix caching on vs
off.

    python benchmarks/engine.py                 # a tiny random Qwen3 written to a temp dir
    python benchmarks/engine.py --model-dir D   # any Qwen3 checkpoint directory (safetensors)

Part 1 runs the same greedy prompts through refimpl (paged KV cache, one packed batch per step)
and through transformers (one prompt at a time, and all prompts in one left-padded batch), and
reports generated tokens per second and whether refimpl's tokens equal transformers'.
Part 2 sends prompts that share a long system prompt, with the prefix cache on and off, and
reports how many prompt tokens the model had to compute. Times depend on the machine; token
counts do not.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from refimpl.engine import LLM, SamplingParams, make_tiny_model


def make_prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 64, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (length,), generator=g).tolist() for length in lengths]


def bench_refimpl(model_dir, prompts, max_tokens, block_size) -> tuple[float, list[list[int]]]:
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(
        model_dir, kvcache_block_size=block_size, enable_prefix_caching=False, dtype="float32"
    ) as llm:
        llm.generate(prompts[:2], sp, use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outputs = llm.generate(prompts, sp, use_tqdm=False)
        return time.perf_counter() - start, [o["token_ids"] for o in outputs]


def bench_transformers(model_dir, prompts, max_tokens) -> tuple[float, float, list[list[int]]]:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    kwargs = dict(max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
    with torch.no_grad():
        ids = torch.tensor([prompts[0]])
        model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)  # warm-up
        start = time.perf_counter()
        one_by_one = []
        for p in prompts:
            ids = torch.tensor([p])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            one_by_one.append(out[0, len(p) :].tolist())
        sequential = time.perf_counter() - start
        width = max(len(p) for p in prompts)
        pad = model.generation_config.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        model.generate(ids, attention_mask=mask, **kwargs)
        batched = time.perf_counter() - start
    return sequential, batched, one_by_one


def bench_prefix_cache(model_dir, num_prompts, prefix_len, block_size) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    system = torch.randint(0, 256, (prefix_len,), generator=g).tolist()
    prompts = [
        system + torch.randint(0, 256, (12,), generator=g).tolist() for _ in range(num_prompts)
    ]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    rows = []
    for enabled in (False, True):
        # A token budget smaller than two prompts puts each prompt in its own prefill step, so
        # later prompts find the system prompt's blocks already registered.
        with LLM(
            model_dir,
            kvcache_block_size=block_size,
            enable_prefix_caching=enabled,
            # closed: the next one gets the memory
            max_num_batched_tokens=prefix_len + 16,
            dtype="float32",
        ) as llm:
            start = time.perf_counter()
            outputs = llm.generate(prompts, sp, use_tqdm=False)
            elapsed = time.perf_counter() - start
        rows.append(
            dict(
                prefix_caching=enabled,
                prompt_tokens=sum(map(len, prompts)),
                prefill_tokens=llm.stats.prefill_tokens,
                cached_tokens=llm.stats.cached_tokens,
                prefill_time_s=llm.stats.prefill_time_s,
                total_time_s=elapsed,
                outputs=[o["token_ids"] for o in outputs],
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model-dir", help="a Qwen3 checkpoint directory (default: a fresh tiny model)"
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--prefix-len", type=int, default=512, help="shared system prompt length (part 2)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1 keeps runs comparable)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # removed when the script ends
    workdir = tempfile.TemporaryDirectory(prefix="refimpl-bench-")
    model_dir = args.model_dir or make_tiny_model(
        workdir.name,
        seed=0,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
    )
    prompts = make_prompts(args.num_prompts)
    generated = args.num_prompts * args.max_tokens
    print(f"model: {model_dir}")
    print(
        f"part 1: {args.num_prompts} prompts of "
        f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
        f"{args.max_tokens} greedy tokens each ({generated} generated), float32, "
        f"{args.threads} thread(s)"
    )
    t_ref, ours = bench_refimpl(model_dir, prompts, args.max_tokens, args.block_size)
    t_seq, t_batch, theirs = bench_transformers(model_dir, prompts, args.max_tokens)
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"  {'engine':44s} {'seconds':>8s} {'tokens/s':>9s}")
    for label, t in (
        (f"refimpl LLM.generate (block_size {args.block_size}, torch)", t_ref),
        ("transformers generate, one prompt at a time", t_seq),
        ("transformers generate, one padded batch", t_batch),
    ):
        print(f"  {label:44s} {t:8.2f} {generated / t:9.0f}")
    print(
        f"  refimpl output equals transformers' (one at a time) for {same}/{len(prompts)} "
        "prompts"
    )

    rows = bench_prefix_cache(model_dir, args.num_prompts, args.prefix_len, args.block_size)
    print(
        f"part 2: {args.num_prompts} prompts = shared {args.prefix_len}-token system prompt + "
        "12 own tokens"
    )
    print(
        f"  {'prefix caching':15s} {'prompt tok':>10s} {'computed':>9s} {'cached':>7s} "
        f"{'prefill s':>9s}"
    )
    for r in rows:
        print(
            f"  {'on' if r['prefix_caching'] else 'off':15s} {r['prompt_tokens']:10d} "
            f"{r['prefill_tokens']:9d} "
            f"{r['cached_tokens']:7d} {r['prefill_time_s']:9.2f}"
        )
    off, on = rows
    print(
        f"  prefill tokens computed: {off['prefill_tokens']} -> {on['prefill_tokens']} "
        f"({1 - on['prefill_tokens'] / off['prefill_tokens']:.1%} fewer); "
        f"outputs identical: {off['outputs'] == on['outputs']}"
    )


if __name__ == "__main__":
    main()
