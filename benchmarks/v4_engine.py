"""Benchmark: the tiny DeepSeek V4 on refimpl's hybrid paged cache next to transformers.

    python benchmarks/v4_engine.py                # a tiny random DeepSeek V4 in a temp dir
    python benchmarks/v4_engine.py --model-dir D  # any DeepSeek V4 checkpoint directory

Part 1 runs the same greedy prompts through refimpl's V4LLM (paged cache, one packed batch per
step) and through transformers' `generate` (one unpadded prompt at a time, the only way its V4
is correct), reports generated tokens per second, whether the tokens are equal, and the
largest difference between the logits behind each token. Both sides use the stable top-k.
Part 2 sends prompts that share a 256-token prefix with the prefix cache on and off and
reports how many prompt tokens the model computed. Times depend on the machine; token counts
do not. One torch thread: these matrices are tiny.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from refimpl.paged.sequence import SamplingParams
from refimpl.v4.llm import V4LLM
from refimpl.v4.oracle import oracle_generate
from refimpl.v4.tiny import make_tiny_v4


def make_prompts(n: int, seed: int = 0, shared: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 256, (shared,), generator=g).tolist()
    lengths = torch.randint(20, 120, (n,), generator=g).tolist()
    return [
        prefix + torch.randint(0, 256, (length,), generator=g).tolist() for length in lengths
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-dir", help="a DeepSeek V4 checkpoint directory (default: a tiny random one)"
    )
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = args.model_dir or make_tiny_v4(tempfile.mkdtemp(prefix="tiny_v4_"), seed=0)
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)

    llm = V4LLM(
        model_dir,
        num_kvcache_blocks=256,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
    )
    prompts = make_prompts(args.num_prompts)
    # warm-up
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    # keep the logits behind every token, to compare them with the oracle's
    llm.record_logits = True
    start = time.perf_counter()
    outputs = llm.generate(prompts, sp)
    ours = time.perf_counter() - start

    start = time.perf_counter()
    oracle = [oracle_generate(llm.hf_model, p, args.max_tokens) for p in prompts]
    theirs = time.perf_counter() - start
    equal = all(o["token_ids"] == r[0] for o, r in zip(outputs, oracle))
    worst = max(
        (a - b).abs().max().item()
        for o, r in zip(outputs, oracle)
        for a, b in zip(o["logits"], r[1])
    )
    generated = args.num_prompts * args.max_tokens
    print(f"Part 1: {args.num_prompts} prompts x {args.max_tokens} greedy tokens")
    print(f"  refimpl V4LLM (paged, batched):        {generated / ours:8.1f} tokens/s")
    print(f"  transformers generate (one at a time): {generated / theirs:8.1f} tokens/s")
    print(f"  tokens equal: {equal}; largest logit difference: {worst:.2e}")

    shared = make_prompts(args.num_prompts, seed=1, shared=256)
    print(
        f"Part 2: {len(shared)} prompts sharing a 256-token prefix (counts for the "
        f"{len(shared) - 1} after the first)"
    )
    llm.close()
    for caching in (False, True):
        with V4LLM(
            model_dir,
            hf_model=llm.hf_model,
            num_kvcache_blocks=256,
            max_num_batched_tokens=512,
            enable_prefix_caching=caching,
        ) as engine:
            engine.generate(shared[:1], sp)  # the first request fills the cache
            engine.generate(shared[1:], sp)
            s = engine.stats
        print(
            f"  prefix caching {'on ' if caching else 'off'}: prefill tokens computed "
            f"{s.prefill_tokens:5d}, "
            f"taken from the cache {s.cached_tokens:5d}"
        )


if __name__ == "__main__":
    main()
