"""Part I side by side: refimpl against nano-vllm's logic (the scheduler loop, reviving a
cached block) and refimpl's CPU engine against transformers' padded-batch `generate`, in one
run.

    python benchmarks/part1.py            # the full run (a few minutes on 2 cores)
    python benchmarks/part1.py --quick    # toy sizes, seconds (what the smoke test runs)

1. The scheduler loop. One seeded offline workload (requests that share long system prompts, an
   own tail each, chunked prefill of long prompts, preemption when the pool runs short) goes
   through refimpl's `Scheduler` + `BlockManager` and through nano-vllm's logic
   (`benchmarks/nano_vllm_logic.py`), with the same fake model step, at pools of 1k/10k/100k
   blocks and block sizes 16 and 256. Both must produce the same schedule (checked). Reported:
   CPU seconds (median of --repeats) and nano / refimpl.
2. Reviving a freed cached block (allocate a request whose first block is a cached block in the
   middle of the free queue, then free it) at pools of 1k to 1M blocks: microseconds each.
3. The engine on one torch thread, greedy, float32, equal outputs checked: (a) 16 prompts of
  about
   100 tokens, 128 new tokens each; (b) 32 requests sharing a 512-token system prompt that an
   earlier request already put in refimpl's prefix cache (as on a server), against
   transformers' padded batch, which computes the system prompt for every request.

CPU time (time.process_time) is measured, so other load on the machine matters less.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

# nano_vllm_logic sits next to this file
sys.path.insert(0, str(Path(__file__).resolve().parent))

from nano_vllm_logic import NanoBlockManager, NanoScheduler, NanoSequence  # noqa: E402

from refimpl.paged import BlockManager, SamplingParams, Scheduler, SchedulerConfig, Sequence  # noqa: E402

VOCAB = 50_000
EOS = 0


# --- 1. the scheduler loop
# The measured workload, and a toy one for the smoke test (same shape, tiny sizes).
FULL_LOOP = dict(
    requests=2000,
    prefix=(256, 3072),
    tail=(16, 256),
    max_tokens=(16, 128),
    max_num_seqs=256,
    max_num_batched_tokens=2048,
)
QUICK_LOOP = dict(
    requests=40,
    prefix=(8, 96),
    tail=(1, 8),
    max_tokens=(2, 12),
    max_num_seqs=8,
    max_num_batched_tokens=64,
)


def make_workload(setup: dict, seed: int) -> list[tuple[list[int], int]]:
    """(prompt, max_tokens) pairs: one of 16 system prompts (a few popular, many rare) plus an
    own tail."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(1, VOCAB) for _ in range(rng.randint(*setup["prefix"]))]
        for _ in range(16)
    ]
    weights = [1 / (rank + 1) for rank in range(len(prefixes))]
    workload = []
    for _ in range(setup["requests"]):
        prefix = rng.choices(prefixes, weights)[0]
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randint(*setup["tail"]))]
        workload.append((prefix + tail, rng.randint(*setup["max_tokens"])))
    return workload


def fake_model(seqs) -> list[int]:
    """The same cheap deterministic 'model' for both loops: a token from the sequence's
    length."""
    return [(seq.num_tokens * 7919 + seq.num_prompt_tokens) % VOCAB for seq in seqs]


def refimpl_scheduler(setup: dict, num_blocks: int, block_size: int) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            num_kvcache_blocks=num_blocks,
            kvcache_block_size=block_size,
            eos=EOS,
            max_num_seqs=setup["max_num_seqs"],
            max_num_batched_tokens=setup["max_num_batched_tokens"],
        )
    )


def run_loop(scheduler, make_sequence, workload, trace: list | None) -> float:
    """CPU seconds to add every request and run `scheduler` to the end; `trace` records each
    step."""
    start = time.process_time()
    for prompt, max_tokens in workload:
        scheduler.add(make_sequence(prompt, max_tokens))
    while not scheduler.is_finished():
        seqs, is_prefill = scheduler.schedule()
        if trace is not None:
            trace.append((is_prefill, [(s.seq_id, s.num_scheduled_tokens) for s in seqs]))
        scheduler.postprocess(seqs, fake_model(seqs), is_prefill)
    return time.process_time() - start


def refimpl_loop(
    setup: dict, workload, num_blocks: int, block_size: int, trace: list | None = None
) -> float:
    """CPU seconds for the whole workload through refimpl's Scheduler."""
    return run_loop(
        refimpl_scheduler(setup, num_blocks, block_size),
        lambda prompt, n: Sequence(
            prompt, SamplingParams(max_tokens=n), block_size=block_size
        ),
        workload,
        trace,
    )


def nano_loop(
    setup: dict, workload, num_blocks: int, block_size: int, trace: list | None = None
) -> float:
    """The same with nano-vllm's logic."""
    scheduler = NanoScheduler(
        num_blocks, block_size, setup["max_num_seqs"], setup["max_num_batched_tokens"], eos=EOS
    )
    return run_loop(
        scheduler, lambda prompt, n: NanoSequence(prompt, block_size, n), workload, trace
    )


def same_schedule(setup: dict, workload, num_blocks: int, block_size: int) -> bool:
    """Run both loops once with tracing; True when every step has the same batch and chunk
    sizes."""
    ours, theirs = [], []
    refimpl_loop(setup, workload, num_blocks, block_size, ours)
    nano_loop(setup, workload, num_blocks, block_size, theirs)

    def relative(trace):  # seq ids count from each implementation's own counter
        first = min(seq_id for _, batch in trace for seq_id, _ in batch)
        return [(p, [(seq_id - first, n) for seq_id, n in batch]) for p, batch in trace]

    return relative(ours) == relative(theirs)


def loop_stats(setup: dict, workload, num_blocks: int, block_size: int) -> dict:
    """Steps, chunked prefills, preemptions and prefix-cache hit tokens of refimpl's run
    (nano-vllm's is the same run: `same_schedule`)."""
    scheduler = refimpl_scheduler(setup, num_blocks, block_size)
    for prompt, max_tokens in workload:
        scheduler.add(
            Sequence(prompt, SamplingParams(max_tokens=max_tokens), block_size=block_size)
        )
    steps = chunked = hit_tokens = 0
    while not scheduler.is_finished():
        fresh = {id(s) for s in scheduler.waiting if not s.block_table}
        seqs, is_prefill = scheduler.schedule()
        steps += 1
        if is_prefill:
            chunked += sum(
                s.num_cached_tokens + s.num_scheduled_tokens < s.num_tokens for s in seqs
            )
            hit_tokens += sum(s.num_cached_tokens for s in seqs if id(s) in fresh)
        scheduler.postprocess(seqs, fake_model(seqs), is_prefill)
    return dict(
        steps=steps,
        chunked=chunked,
        preemptions=scheduler.num_preemptions,
        hit_tokens=hit_tokens,
    )


def median_time(fn, repeats: int, *args) -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        times.append(fn(*args))
    return statistics.median(times)


def section_loop(args) -> None:
    setup = args.loop
    workload = make_workload(setup, args.seed)
    prompt_tokens = sum(len(p) for p, _ in workload)
    print(
        f"1. Scheduler loop: {len(workload)} requests ({prompt_tokens:,} prompt tokens; 16 "
        "shared system prompts "
        f"of {setup['prefix'][0]}-{setup['prefix'][1]} tokens + own tails of "
        f"{setup['tail'][0]}-{setup['tail'][1]}; "
        f"max_tokens {setup['max_tokens'][0]}-{setup['max_tokens'][1]}), "
        f"max_num_seqs={setup['max_num_seqs']}, "
        f"max_num_batched_tokens={setup['max_num_batched_tokens']}; CPU s, median of "
        f"{args.repeats}"
    )
    print(
        f"{'block size':>10} {'pool blocks':>11} {'steps':>6} {'chunked':>7} {'preempt':>7} "
        f"{'same':>5} "
        f"{'nano-vllm s':>11} {'refimpl s':>9} {'nano/refimpl':>12}"
    )
    for block_size in args.block_sizes:
        for num_blocks in args.pools:
            same = same_schedule(setup, workload, num_blocks, block_size)
            stats = loop_stats(setup, workload, num_blocks, block_size)
            theirs = median_time(
                nano_loop, args.repeats, setup, workload, num_blocks, block_size
            )
            ours = median_time(
                refimpl_loop, args.repeats, setup, workload, num_blocks, block_size
            )
            print(
                f"{block_size:>10} {num_blocks:>11,} {stats['steps']:>6} "
                f"{stats['chunked']:>7} "
                f"{stats['preemptions']:>7} {'yes' if same else 'NO':>5} {theirs:>11.3f} "
                f"{ours:>9.3f} "
                f"{theirs / ours:>11.2f}x"
            )


# --- 2. reviving a cached block
def revival_us(
    manager,
    make_seq,
    num_blocks: int,
    block_size: int,
    num_revivals: int,
    repeats: int,
    seed: int,
) -> tuple[float, int]:
    """(Microseconds per allocate + deallocate of a request whose first block is a freed cached
    block, revivals timed per repeat).

    The pool is filled by about 2,000 requests of full blocks (plus one token), registered and
    freed; the targets are first blocks sitting in the middle half of the free queue.
    """
    rng = random.Random(seed)
    per_seq = max(1, num_blocks // 2000)
    num_seqs = num_blocks // (per_seq + 1)
    firsts = []
    for i in range(num_seqs):
        tokens = [
            (i * per_seq * block_size + j) % (1 << 40) for j in range(per_seq * block_size)
        ]
        # one token past the full blocks (an id no block holds)
        seq = make_seq(tokens + [1 << 40])
        manager.allocate(seq, 0)
        seq.num_scheduled_tokens = per_seq * block_size
        manager.hash_blocks(seq)
        manager.deallocate(seq)
        firsts.append(tokens[:block_size])
    position = {block_id: pos for pos, block_id in enumerate(manager.free_block_ids)}
    middle = [
        t
        for t in firsts
        if num_blocks // 4
        <= position[manager.hash_to_block_id[manager.compute_hash(t)]]
        < 3 * num_blocks // 4
    ]
    # Each revival takes one fresh block from the head; the head quarter stays ahead of every
    # target. No target is revived twice (a revived block goes back to the tail of the queue).
    count = min(num_revivals, len(middle) // repeats, num_blocks // (4 * repeats))
    chosen = rng.sample(middle, count * repeats)
    times = []
    for r in range(repeats):
        targets = [make_seq(t + [(1 << 40) + 1]) for t in chosen[r * count : (r + 1) * count]]
        gc.collect()
        start = time.process_time()
        for seq in targets:
            manager.allocate(seq, 1)
            manager.deallocate(seq)
        times.append((time.process_time() - start) / count * 1e6)
    return statistics.median(times), count


def section_revival(args) -> None:
    print(
        "\n2. Reviving a freed cached block from the middle of the free queue (allocate + "
        "deallocate), "
        f"block size 16; CPU us each, median of {args.repeats}"
    )
    print(
        f"{'pool blocks':>11} {'revivals':>8} {'nano-vllm us':>12} {'refimpl us':>10} "
        f"{'nano/refimpl':>12}"
    )
    bs = 16
    for num_blocks in args.revive_pools:
        # nano-vllm: ms each
        wanted = args.revivals if num_blocks < 1_000_000 else max(args.revivals // 20, 5)
        theirs, count = revival_us(
            NanoBlockManager(num_blocks, bs),
            lambda t: NanoSequence(t, bs, 1),
            num_blocks,
            bs,
            wanted,
            args.repeats,
            args.seed,
        )
        ours, _ = revival_us(
            BlockManager(num_blocks, bs),
            lambda t: Sequence(t, block_size=bs),
            num_blocks,
            bs,
            wanted,
            args.repeats,
            args.seed,
        )
        print(
            f"{num_blocks:>11,} {count:>8} {theirs:>12.1f} {ours:>10.1f} "
            f"{theirs / ours:>11.1f}x"
        )


# --- 3. the engine against transformers
MODEL_SIZES = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
)  # benchmarks/engine.py's tiny Qwen3


def engine_workloads(quick: bool) -> dict:
    """name -> (prompts, new tokens each, the earlier request that cached the system prompt or
    None)."""
    rng = random.Random(1)
    n_plain, plain_len, plain_new = (4, 24, 8) if quick else (16, 100, 128)
    n_shared, system_len, shared_new = (4, 64, 4) if quick else (32, 512, 32)
    plain = [
        [rng.randrange(256) for _ in range(plain_len + rng.randint(-10, 10))]
        for _ in range(n_plain)
    ]
    system = [rng.randrange(256) for _ in range(system_len)]
    shared = [
        system + [rng.randrange(256) for _ in range(rng.randint(8, 24))]
        for _ in range(n_shared)
    ]
    # the earlier request that cached the prompt
    warm = system + [rng.randrange(256) for _ in range(8)]
    return dict(plain=(plain, plain_new, None), shared=(shared, shared_new, warm))


def run_refimpl(
    model_dir, prompts, max_tokens, warm, repeats: int, block_size: int
) -> tuple[float, list]:
    """Median CPU seconds of LLM.generate (after a warm-up; `warm` first puts the system prompt
    in the prefix cache of every timed engine), and the outputs."""
    from refimpl.engine import LLM
    from refimpl.paged import SamplingParams as SP

    sp = SP(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    times, outputs = [], None
    for _ in range(repeats):
        # 16k tokens
        llm = LLM(
            model_dir,
            kvcache_block_size=block_size,
            num_kvcache_blocks=16384 // block_size,
            dtype="float32",
            max_num_batched_tokens=16384,
        )
        llm.generate([prompts[0][:8]], sp, use_tqdm=False)  # warm-up (first-call costs)
        if warm is not None:
            llm.generate([warm], SP(temperature=0, max_tokens=1), use_tqdm=False)
        gc.collect()
        start = time.process_time()
        result = llm.generate(prompts, sp, use_tqdm=False)
        times.append(time.process_time() - start)
        outputs = [r["token_ids"] for r in result]
    return statistics.median(times), outputs


def run_transformers(model_dir, prompts, max_tokens, repeats: int) -> tuple[float, list]:
    """Median CPU seconds of one left-padded batch `generate` (greedy), and the outputs."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    pad = model.generation_config.pad_token_id or 0
    # No end-of-sequence token: exactly max_tokens each, and the end token stays an ordinary
    # candidate, as with refimpl's ignore_eos (min_new_tokens would forbid it instead).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = pad
    kwargs = dict(max_new_tokens=max_tokens, do_sample=False)
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    times, outputs = [], None
    with torch.no_grad():
        # warm-up
        model.generate(
            ids[:1, -8:], attention_mask=mask[:1, -8:], **{**kwargs, "max_new_tokens": 2}
        )
        for _ in range(repeats):
            gc.collect()
            start = time.process_time()
            out = model.generate(ids, attention_mask=mask, **kwargs)
            times.append(time.process_time() - start)
            outputs = out[:, width:].tolist()
    return statistics.median(times), outputs


def section_engine(args) -> None:
    import tempfile

    import torch

    from refimpl.engine import make_tiny_model

    torch.set_num_threads(1)
    workdir = tempfile.TemporaryDirectory(prefix="refimpl-part1-")
    model_dir = make_tiny_model(workdir.name, seed=0, **MODEL_SIZES)
    sizes = ", ".join(f"{k}={v}" for k, v in MODEL_SIZES.items())
    print(
        f"\n3. Engine on one torch thread, float32, greedy; tiny random Qwen3 ({sizes}); "
        f"block size {args.engine_block_size}; CPU time, median of {args.engine_repeats}, the "
        "two alternating"
    )
    print(
        f"{'workload':<44} {'transformers tok/s':>18} {'refimpl tok/s':>13} "
        f"{'refimpl/hf':>10} {'equal':>7}"
    )
    labels = dict(
        plain="{n} prompts of ~{length} tokens, {new} new each",
        shared="{n} requests, cached {length}-token system prompt, {new} new",
    )
    for name, (prompts, new, warm) in engine_workloads(args.quick).items():
        # Alternate the two so that both see the same machine, repeat after repeat.
        hf_times, our_times = [], []
        for _ in range(args.engine_repeats):
            t_hf, out_hf = run_transformers(model_dir, prompts, new, 1)
            t_ours, out_ours = run_refimpl(
                model_dir, prompts, new, warm, 1, args.engine_block_size
            )
            hf_times.append(t_hf)
            our_times.append(t_ours)
        t_hf, t_ours = statistics.median(hf_times), statistics.median(our_times)
        generated = len(prompts) * new
        equal = sum(a == b for a, b in zip(out_ours, out_hf))
        length = (
            len(warm) - 8 if warm is not None else round(statistics.mean(map(len, prompts)))
        )
        label = labels[name].format(n=len(prompts), length=length, new=new)
        print(
            f"{label:<44} {generated / t_hf:>18.0f} {generated / t_ours:>13.0f} "
            f"{t_hf / t_ours:>9.2f}x "
            f"{equal:>3}/{len(prompts):<3}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="toy sizes (a smoke test, not a measurement)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sections", default="loop,revive,engine")
    parser.add_argument("--engine-block-size", type=int, default=16)
    parser.add_argument("--engine-repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.quick:
        args.loop, args.pools, args.block_sizes = QUICK_LOOP, [60, 600], [4, 16]
        args.revive_pools, args.revivals, args.repeats, args.engine_repeats = (
            [1000, 10_000],
            20,
            1,
            1,
        )
    else:
        args.loop, args.pools, args.block_sizes = (
            FULL_LOOP,
            [1_000, 10_000, 100_000],
            [16, 256],
        )
        args.revive_pools, args.revivals = [1_000, 10_000, 100_000, 1_000_000], 200
    sections = args.sections.split(",")
    if "loop" in sections:
        section_loop(args)
    if "revive" in sections:
        section_revival(args)
    if "engine" in sections:
        section_engine(args)


if __name__ == "__main__":
    main()
